"""``mx-train``: parse the flags, train each run, print the report and a sample."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import mx_nn
from mx_nn.models.llama import Llama
from mx_nn.train import checkpoint
from mx_nn.train.args import BF16, TrainArgs, parse_args
from mx_nn.train.data import ByteData, load_text
from mx_nn.train.distributed import is_main, setup
from mx_nn.train.export import export_live
from mx_nn.train.guard import DIVERGED, TrainingDiverged
from mx_nn.train.loop import RunResult, TrainingInterrupted, mx_filter, train_run
from mx_nn.train.manifest import CheckpointError
from mx_nn.train.report import layer_sqnr, table, write_figures
from mx_nn.train.sample import greedy
from mx_nn.train.stop import INTERRUPTED, StopFlag

__all__ = ["FAILED", "NOT_IDENTITY", "RunFailed", "UsageError", "console", "main", "run"]


class UsageError(Exception):
    """A flag's value cannot work here (the message names the flag); exit status 2."""


class RunFailed(Exception):
    """The run cannot go on (e.g. --out cannot be written); the message says why and what
    is kept; exit status 1."""


FAILED = 1
"""Exit status of a run that failed with a message: a checkpoint that cannot be written
(disk full, no permission) or trusted (corrupt), an unwritable --out or report."""


logger = logging.getLogger("mx_nn.train")
SAMPLE_BYTES = 160
"""Bytes the greedy sample continues its prompt by."""


_LOGGERS = ("mx_core", "mx_kernels", "mx_dtensor", "mx_nn")


def _log_name() -> str:
    # torchrun's RANK; the process group is not up yet. Rank 0 keeps the plain name.
    rank = int(os.environ.get("RANK", "0"))
    return "train.log" if rank == 0 else f"train-rank{rank}.log"


class _LogFile(logging.FileHandler):
    # A log line that cannot be written (disk full) is not worth a traceback per line.
    def handleError(self, record: logging.LogRecord) -> None:
        if not getattr(self, "_failed", False):
            self._failed = True
            print(f"mx-train: warning: cannot write {self.baseFilename}: "
                  f"{sys.exc_info()[1]}; its further lines are lost", file=sys.stderr)  # fmt: skip


@contextlib.contextmanager
def _log_to(out: Path):
    # Which kernels and paths ran (INFO on the mx_* loggers) goes to the run's log file,
    # one per rank (ranks writing one file would interleave their lines).
    handler = _LogFile(out / _log_name())
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.setLevel(logging.INFO)
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO)
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
        handler.close()


def _say(*lines: str) -> None:
    if is_main():
        print(*lines, sep="\n", flush=True)


NOT_IDENTITY = ("resume", "overwrite", "device", "save_every", "out", "data", "export")
"""Flags a resumed run may change: how it runs and saves, not what it computes. Where
--out is now is not part of the run (a moved --out resumes); --data is compared by its
bytes' SHA-256 instead of its path, so a moved file resumes and an edited one does not."""


def _check_resume(args: TrainArgs, saved: dict, data: ByteData) -> None:
    now, then = args.to_dict(), saved["args"]
    differ = [k for k in now if k not in NOT_IDENTITY and now[k] != then.get(k)]
    if differ:
        flags = ", ".join(f"--{k.replace('_', '-')} {then.get(k)!r} (now {now[k]!r})"
                          for k in differ)  # fmt: skip
        raise UsageError(
            f"argument --resume: the checkpoint was made with {flags}; resume with the same flags"
        )
    if saved["data_sha256"] != data.sha256:
        was, now_ = then["data"] or "the built-in corpus", args.data or "the built-in corpus"
        raise UsageError(f"argument --data: the checkpoint was trained on {was} (sha256 "
                         f"{saved['data_sha256'][:12]}...), {now_} holds other bytes (sha256 "
                         f"{data.sha256[:12]}...); resume on the same text")  # fmt: skip


def _full_state_dict(model: torch.nn.Module) -> dict:
    """``model``'s weights as plain tensors; when sharded (DTensors over tp and/or dp)
    gathered in full to rank 0's CPU memory (the other ranks get an empty dict)."""
    if dist.is_initialized():
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return model.state_dict()


def _local_copy(sd: dict, args: TrainArgs, recipe: str, device) -> tuple:
    """A one-process bf16 model and (for an MX recipe) an MX model holding ``sd``."""
    reference = Llama(args.model_config).to(device)
    reference.load_state_dict(sd)
    if recipe == BF16:
        return reference, None
    mx = Llama(args.model_config).to(device)
    mx.load_state_dict(sd)
    return reference, mx_nn.convert(mx, recipe, filter_fn=mx_filter)


def run(args: TrainArgs) -> int:
    """Run ``args``: each run in turn, then the export, the report and a greedy sample.

    Args:
        args: the parsed flags (:func:`~mx_nn.train.args.parse_args`).
    Returns:
        The exit status: 0, or 130 when interrupted by SIGINT/SIGTERM (resumable).
    Raises:
        UsageError: a flag's value cannot work here (exit status 2).
        RunFailed: --out, the export or the report cannot be written (exit status 1).
        CheckpointError: a checkpoint cannot be written or trusted.
        TrainingDiverged: a non-finite loss, gradient norm or parameter.
    """
    out = Path(args.out)
    log = contextlib.ExitStack()
    try:
        out.mkdir(parents=True, exist_ok=True)
        log.enter_context(_log_to(out))
    except OSError as e:
        raise UsageError(f"argument --out: cannot write in {args.out!r}: {e.strerror or e}") from e
    with log:
        try:
            with StopFlag().installed() as stop:
                return _run(args, out, stop)
        except OSError as e:
            logger.exception("mx-train: failed")
            where = f": {e.filename}" if e.filename else ""
            raise RunFailed(f"{e.strerror or e}{where}") from e


def _run(args: TrainArgs, out: Path, stop: StopFlag) -> int:
    try:
        mesh, device = setup(args)
        text, source = load_text(args.data)
        data = ByteData(text, seq=args.seq)
    except (RuntimeError, ValueError) as e:  # each names the flag at fault
        raise UsageError(str(e)) from e
    ckpt = out / "checkpoint"
    gen = checkpoint.find(ckpt) if args.resume else None  # verified on every rank
    saved = checkpoint.load_loop(gen) if gen is not None else None
    if saved is not None:
        _check_resume(args, saved, data)
    results = [RunResult(**d) for d in saved["done"]] if saved else []
    cfg = args.model_config
    _say(f"mx-train: {' then '.join(args.runs)}; {cfg.n_layers} layers, dim {cfg.dim}, "
         f"{cfg.n_heads} heads ({cfg.n_kv_heads} kv), ffn {cfg.hidden_dim}; "
         f"{args.steps} steps x {args.batch} x {args.seq} bytes on {device}; "
         f"data: {source} ({len(data.train):,} train / {len(data.heldout):,} held-out "
         f"bytes); out: {out}" + (f"; resuming {gen}" if gen else ""))  # fmt: skip
    t0 = time.perf_counter()
    for i in range(len(results), len(args.runs)):
        resume = gen if saved is not None and saved["run_index"] == i else None
        try:
            result, model = train_run(args, i, data, device, mesh=mesh, ckpt=ckpt,
                                      done=results, stop=stop, resume=resume)  # fmt: skip
        except TrainingInterrupted as e:
            _say(f"mx-train: interrupted: {e}. Continue with the same flags and --resume.")
            return INTERRUPTED
        results.append(result)
        if stop.agreed(mesh):  # the signal came during the run's last save
            then = "writes the report" if i + 1 == len(args.runs) else "goes on"
            _say(f"mx-train: interrupted: {result.recipe} finished; checkpoint in "
                 f"{checkpoint.latest(ckpt)}. With the same flags, --resume {then}.")  # fmt: skip
            return INTERRUPTED
    seconds = time.perf_counter() - t0
    if args.export is not None:
        _export(model, args, ckpt)  # a collective under torchrun
    sd = _full_state_dict(model)  # a collective: every rank takes part
    if not is_main():
        return 0
    try:
        return _report(args, out, data, results, sd, seconds, device, stop)
    except OSError as e:
        raise RunFailed(f"cannot write the report in --out {str(out)!r}: {e.strerror or e}; "
                        "the checkpoint is complete: --resume with the same flags writes "
                        "the report again") from e  # fmt: skip


def _export(model: torch.nn.Module, args: TrainArgs, ckpt: Path) -> None:
    """``--export``: the final model, one tensor at a time (gathered, under torchrun)."""
    try:
        path, scheme = export_live(model, args)
    except (OSError, ValueError) as e:
        raise RunFailed(f"cannot export to --export {args.export!r}: {e}; the checkpoint "
                        f"{checkpoint.latest(ckpt)} is complete: python -m mx_nn.export "
                        f"{ckpt} {args.export} writes the export from it") from e  # fmt: skip
    _say(f"exported the {args.recipe} model as {scheme.name} ({scheme.format}, "
         f"compressed-tensors) to {path}")  # fmt: skip


def _report(args: TrainArgs, out: Path, data: ByteData, results: list[RunResult], sd: dict,
            seconds: float, device: torch.device, stop: StopFlag) -> int:  # fmt: skip
    """Table, figures, JSON and a greedy sample (rank 0); a signal stops it between parts."""
    reference, mx = _local_copy(sd, args, args.runs[-1], device)
    sqnr = None
    if mx is not None:
        batch = data.heldout_batches(args.batch)[0][0].to(device)
        sqnr = layer_sqnr(reference, mx, batch, args.autocast)
    _say("", table(results, sqnr))
    paths = write_figures(out, results, sqnr, {"args": args.to_dict(),
                                               "train_seconds": seconds})  # fmt: skip
    _say("figures and JSON: " + ", ".join(str(p) for p in paths))
    if stop.requested:
        _say("mx-train: interrupted before the greedy sample; the report is written.")
        return INTERRUPTED
    prompt = bytes(data.heldout[: min(48, len(data.heldout) // 2)].tolist())
    model = mx if mx is not None else reference
    raw = greedy(model, prompt, SAMPLE_BYTES, max_seq_len=args.seq, autocast=args.autocast)
    text = raw.decode("utf-8", errors="replace")
    _say(f"greedy sample ({args.runs[-1]}; the first {len(prompt)} bytes are the prompt):",
         "-" * 60, text, "-" * 60)  # fmt: skip
    return INTERRUPTED if stop.requested else 0


def _teardown(barrier: bool) -> bool:
    """Destroy the process group, if any; whether there was one."""
    if not dist.is_initialized():
        return False
    # Every rank reaches the barrier only once its last collective is done, so no rank
    # tears gloo down while another's is in flight (gloo's worker threads holding
    # pending work at teardown abort the process: pytorch/pytorch#179291). After an
    # unexpected error the other ranks may never arrive: no barrier then.
    if barrier:
        dist.barrier()
    dist.destroy_process_group()
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``mx-train`` in-process (``mx-train --help`` lists the flags).

    Args:
        argv: the arguments (default ``sys.argv[1:]``).
    Returns:
        The exit status: 0; 1 (:data:`FAILED`), 2 (a usage error), 3 (diverged:
        :data:`~mx_nn.train.guard.DIVERGED`) or 130 (interrupted), each failure with its
        message on stderr.
    """
    return _main(argv)[0]


def _main(argv: Sequence[str] | None) -> tuple[int, bool]:
    """(exit status, whether the run had a process group)."""
    args = parse_args(argv)
    try:
        status = run(args)
    except (UsageError, RunFailed, CheckpointError, TrainingDiverged) as e:
        print(f"mx-train: error: {e}", file=sys.stderr)
        status = {UsageError: 2, TrainingDiverged: DIVERGED}.get(type(e), FAILED)
        # A checkpoint error or divergence reaches every rank at the same point.
        return status, _teardown(barrier=not isinstance(e, UsageError | RunFailed))
    except KeyboardInterrupt:
        print("mx-train: interrupted at once (a second Ctrl-C); --resume continues from the "
              f"newest complete checkpoint in {Path(args.out) / 'checkpoint'}",
              file=sys.stderr)  # fmt: skip
        return INTERRUPTED, _teardown(barrier=False)
    except BaseException:
        _teardown(barrier=False)
        raise
    return status, _teardown(barrier=True)


def console(argv: Sequence[str] | None = None) -> None:
    """The ``mx-train`` command: :func:`main`, then exit with its status.

    Args:
        argv: as :func:`main`.

    After a run with a process group (under torchrun) the process ends without the
    interpreter's finalization, its output flushed first: gloo's worker threads can still
    hold work objects whose tensors reference Python objects, and freeing them while the
    interpreter is torn down aborts the process (SIGABRT, "terminate called without an
    active exception") although the run has finished and its group was destroyed
    (pytorch/pytorch#179291; seen about once in 25 two-rank CPU runs on a loaded
    machine)."""
    status, distributed = _main(argv)
    if not distributed:
        sys.exit(status)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
