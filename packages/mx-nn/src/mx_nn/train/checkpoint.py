"""Checkpoints of a run, in generations: ``<out>/checkpoint/<serial>-<tag>/`` holds
model and optimizer through ``torch.distributed.checkpoint`` (each rank writes its own
shards, so a sharded model saves as it is), ``loop-rank<r>.pt`` per rank (step, RNG
states, finished runs, loss history) and, written last, a
:mod:`~mx_nn.train.manifest` with every file's SHA-256.

A generation is complete once its manifest exists. A save writes a new generation
beside the old ones, fsyncs every file and folder, writes the manifest (one rename),
and only then removes the older generations (each manifest first). So a crash at any
point leaves the newest complete generation, old or new, for :func:`find`; incomplete
ones are ignored and removed by the next save.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from mx_nn.train import manifest
from mx_nn.train.manifest import CheckpointError

__all__ = ["CheckpointError", "find", "generations", "latest", "load", "load_loop",
           "rng_state", "save", "set_rng_state", "verify"]  # fmt: skip

logger = logging.getLogger("mx_nn.train")
_GENERATION = re.compile(r"^(\d{6,})-[A-Za-z0-9_.-]+$")
T = TypeVar("T")


@contextlib.contextmanager
def _quiet_single_process():
    # DCP warns that it "assumes the intent is to save in a single process" even when
    # told so (no_dist=True); one process is the intent here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _reason(e: BaseException) -> str:
    # A write error inside torch.save's C++ writer comes back as a RuntimeError about the
    # zip stream; the OSError (disk full, ...) that caused it is in its context.
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    e = cause or e
    if isinstance(e, OSError):
        return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    return f"{type(e).__name__}: {e}" if not isinstance(e, CheckpointError) else str(e)


def _on_main(fn: Callable[[], T], what: str) -> T:
    """``fn()`` on rank 0, its result on every rank; an OSError or CheckpointError there
    raises CheckpointError("<what>: <reason>") on every rank (no rank is left waiting)."""
    result: list[Any] = [None, None]
    if _rank() == 0:
        try:
            result = [fn(), None]
        except (OSError, CheckpointError) as e:
            result = [None, f"{what}: {_reason(e)}"]
    if dist.is_initialized():
        dist.broadcast_object_list(result, src=0)
    if result[1] is not None:
        raise CheckpointError(result[1])
    return result[0]


def _gather(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order."""
    if not dist.is_initialized():
        return [value]
    out: list[Any] = [None] * _world()
    dist.all_gather_object(out, value)
    return out


def _agree(error: str | None, what: str) -> None:
    """Raise CheckpointError on every rank when any rank has an ``error``."""
    errors = [f"rank {r}: {e}" if _world() > 1 else e
              for r, e in enumerate(_gather(error)) if e is not None]  # fmt: skip
    if errors:
        raise CheckpointError(f"{what}: " + "; ".join(errors))


def rng_state() -> dict[str, Any]:
    """This process's torch RNG states.

    Returns:
        ``{"cpu": state}``, plus ``"cuda"``: every CUDA device's, when CUDA is initialised.
    """
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore this process's torch RNG states.

    Args:
        state: what :func:`rng_state` returned.
    """
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def generations(root: Path) -> list[Path]:
    """The generation folders of a checkpoint root.

    Args:
        root: ``<out>/checkpoint``.
    Returns:
        Its ``<serial>-<tag>`` folders, complete or not, oldest (lowest serial) first;
        empty where ``root`` is no folder.
    """
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _GENERATION.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name.split("-", 1)[0]))


def latest(root: Path) -> Path | None:
    """The newest complete generation in a checkpoint root.

    Args:
        root: ``<out>/checkpoint``.
    Returns:
        The newest generation that has a manifest (not verified), or None.
    """
    complete = [g for g in generations(root) if (g / manifest.MANIFEST).is_file()]
    return complete[-1] if complete else None


def _kept(root: Path) -> str:
    old = latest(root)
    return f"the newest complete checkpoint, {old}, is unchanged" if old else \
        "no complete checkpoint exists yet"  # fmt: skip


def _new_generation(root: Path, tag: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    serial = max((int(g.name.split("-", 1)[0]) for g in generations(root)), default=0) + 1
    gen = root / f"{serial:06d}-{tag}"
    gen.mkdir()
    manifest.fsync_dir(root)
    return gen


def _prune(root: Path, keep: Path) -> None:
    # The new generation is complete: the rest goes, each generation's manifest first, so
    # a crash halfway never leaves an older folder that looks complete.
    for entry in root.iterdir():
        if entry == keep:
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                (entry / manifest.MANIFEST).unlink(missing_ok=True)
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as e:
            logger.warning("mx-train: could not remove the old %s: %s", entry, _reason(e))
    manifest.fsync_dir(root)


def _dcp_failure(e: CheckpointException, what: str) -> CheckpointError:
    # DCP wraps every rank's exception, Ctrl-C included: let those through as they are.
    for exc, _ in e.failures.values():
        if not isinstance(exc, Exception):
            raise exc
    reasons = "; ".join(f"rank {r}: {_reason(exc)}" for r, (exc, _) in e.failures.items())
    return CheckpointError(f"{what}: {reasons}")


def save(root: Path, model: nn.Module, optimizer: torch.optim.Optimizer, loop: dict,
         tag: str) -> Path:  # fmt: skip
    """Write a new complete generation ``<serial>-<tag>`` in ``root`` holding ``model``,
    ``optimizer`` and this rank's ``loop`` state (picklable values and tensors), then
    remove the older ones. A collective when a process group is up.

    Args:
        root: ``<out>/checkpoint`` (created if missing).
        model, optimizer: what to save, sharded or not.
        loop: this rank's loop state (picklable values and tensors).
        tag: the generation's name after its serial (``[A-Za-z0-9_.-]``).
    Returns:
        The new generation's folder.
    Raises:
        CheckpointError: a write failed on some rank (disk full, no permission, ...);
            the previous complete generation is left as it was.
    """
    rank, world = _rank(), _world()
    gen = _on_main(lambda: _new_generation(root, tag), f"cannot create a checkpoint in {root}")
    failed = f"cannot write the checkpoint {gen} ({_kept(root)})"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        with _quiet_single_process():
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(gen),
                     no_dist=not dist.is_initialized())  # fmt: skip
    except CheckpointException as e:
        raise _dcp_failure(e, failed) from None
    except OSError as e:
        raise CheckpointError(f"{failed}: {_reason(e)}") from None
    error, buffer = None, io.BytesIO()
    torch.save(loop, buffer)  # in memory: an OSError of the write below stays an OSError
    try:
        with open(gen / f"loop-rank{rank}.pt", "wb") as f:
            f.write(buffer.getbuffer())
    except OSError as e:
        error = _reason(e)
    _agree(error, failed)
    names = _on_main(lambda: sorted(p.name for p in gen.iterdir() if p.is_file()), failed)
    digests, error = {}, None
    try:  # each rank hashes and fsyncs its share of the files
        digests = {n: manifest.digest(gen / n, sync=True) for n in names[rank::world]}
    except OSError as e:
        error = _reason(e)
    shares = _gather(digests)
    _agree(error, failed)

    def finish() -> Path:
        manifest.fsync_dir(gen)
        manifest.write(gen, {n: d for share in shares for n, d in share.items()})
        _prune(root, keep=gen)
        return gen

    return _on_main(finish, failed)


def verify(gen: Path) -> None:
    """Check every file of generation ``gen`` against its manifest (the ranks share the
    files out) and that it holds this world's files; a collective under a process group.

    Args:
        gen: a complete generation.
    Raises:
        CheckpointError: naming each file missing or changed.
    """
    files = _on_main(lambda: manifest.read(gen), f"checkpoint {gen} cannot be used")
    needed = [".metadata", *(f"loop-rank{r}.pt" for r in range(_world()))]
    missing = [n for n in needed if n not in files]
    if missing:
        raise CheckpointError(f"checkpoint {gen} lacks {', '.join(missing)} in its manifest "
                              f"(made with another number of processes?)")  # fmt: skip
    names = sorted(files)
    mine = {n: files[n] for n in names[_rank() :: _world()]}
    problems = [p for share in _gather(manifest.check_files(gen, mine)) for p in share]
    if problems:
        raise CheckpointError(f"checkpoint {gen} is corrupt, so it is not resumed from:\n  "
                              + "\n  ".join(problems) + "\nrestore those files, or start "
                              "again with --overwrite")  # fmt: skip


def find(root: Path) -> Path:
    """The newest complete generation in ``root``, verified (:func:`verify`). A corrupt
    newest generation is refused, never skipped for an older one. A collective under a
    process group.

    Args:
        root: ``<out>/checkpoint``.
    Returns:
        The verified generation's folder.
    Raises:
        CheckpointError: none is complete, or the newest is corrupt.
    """
    gen = _on_main(lambda: latest(root), f"cannot read {root}")
    if gen is None:
        raise CheckpointError(f"no complete checkpoint in {root}")
    verify(gen)
    return gen


def load(gen: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load a generation into ``model`` and ``optimizer``, in place. A collective under a
    process group.

    Args:
        gen: a verified generation (:func:`find`).
        model, optimizer: built as when saved (either sharded or not).
    Returns:
        This rank's loop state (:func:`load_loop`).
    Raises:
        CheckpointError: DCP failed on some rank (naming each), or as :func:`load_loop`.
    """
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    try:
        with _quiet_single_process():
            dcp.load(state, checkpoint_id=str(gen), no_dist=not dist.is_initialized())
    except CheckpointException as e:
        raise _dcp_failure(e, f"cannot load the checkpoint {gen}") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])  # fmt: skip
    return load_loop(gen)


def load_loop(gen: Path) -> dict:
    """This rank's loop state alone (no model or optimizer).

    Args:
        gen: a verified generation.
    Returns:
        The dict :func:`save` was given on this rank.
    Raises:
        CheckpointError: some rank cannot read its ``loop-rank<r>.pt``.
    """
    path = gen / f"loop-rank{_rank()}.pt"
    state, error = None, None
    try:
        state = torch.load(path, weights_only=True)
    except Exception as e:  # a verified file that still fails: name it, whatever it is
        error = f"{path}: {_reason(e)}"
    _agree(error, "cannot read the loop state")
    return state
