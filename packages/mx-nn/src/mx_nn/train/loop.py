"""One training run: build the model in a recipe, train it with AdamW under bf16
autocast, evaluate the held-out loss, checkpoint every ``--save-every`` steps, at the end,
and on Ctrl-C, SIGTERM or a crash; stop at a non-finite loss without saving it."""

from __future__ import annotations

import logging
import math
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

import mx_nn
from mx_nn.models.llama import Llama
from mx_nn.train import checkpoint
from mx_nn.train.args import BF16, TrainArgs
from mx_nn.train.data import ByteData
from mx_nn.train.distributed import (
    agree_step,
    apply_parallel,
    dp_shard,
    is_main,
    max_over_ranks,
    sum_over_dp,
)
from mx_nn.train.guard import NonFiniteError, TrainingDiverged, all_finite, first_nonfinite_module
from mx_nn.train.manifest import CheckpointError
from mx_nn.train.progress import Progress
from mx_nn.train.stop import StopFlag

__all__ = ["RunResult", "TrainingInterrupted", "build_model", "mx_filter", "train_run"]

logger = logging.getLogger("mx_nn.train")
EVALS = 10
"""Held-out evaluations per run (and the last step)."""


class TrainingInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped a run at a step boundary; a checkpoint was written."""

    def __init__(self, recipe: str, step: int, path: Path) -> None:
        super().__init__(f"{recipe} stopped after step {step}; checkpoint in {path}")
        self.recipe, self.step, self.path = recipe, step, path


@dataclass
class RunResult:
    """Curves and figures of one run. Losses in nats per token."""

    recipe: str
    steps: list[int] = field(default_factory=list)
    """Steps at which the held-out loss was measured."""
    train_loss: list[float] = field(default_factory=list)
    """Mean training loss (of the global batch) over the steps since the previous
    evaluation."""
    heldout_loss: list[float] = field(default_factory=list)
    """Held-out loss after that step (over the whole held-out set, which the
    data-parallel ranks share out)."""
    tokens: int = 0
    """Training tokens timed, of all data-parallel ranks (the first step of each process
    excluded: warm-up)."""
    seconds: float = 0.0
    """Wall time of those steps."""
    peak_memory_mib: float = 0.0
    """Peak CUDA memory allocated, or on CPU the process's peak RSS so far (MiB); the
    largest of all ranks."""
    memory_kind: str = ""
    """``"cuda allocated"`` or ``"cpu process RSS"``."""

    @property
    def tokens_per_s(self) -> float:
        """Training throughput of all ranks together."""
        return self.tokens / self.seconds if self.seconds else math.nan

    @property
    def final_train_loss(self) -> float:
        """The last entry of :attr:`train_loss`."""
        return self.train_loss[-1] if self.train_loss else math.nan

    @property
    def final_heldout_loss(self) -> float:
        """The last entry of :attr:`heldout_loss`."""
        return self.heldout_loss[-1] if self.heldout_loss else math.nan

    def to_dict(self) -> dict:
        """Fields as plain Python values."""
        return asdict(self)


def mx_filter(module: nn.Module, fqn: str) -> bool:
    """``convert``'s filter for the MX runs: every linear but the vocabulary projection
    ``output``, which stays bf16 as MX training recipes commonly keep it (the loss reads
    its outputs directly).

    Args:
        module: a linear of the model (unused: the name decides).
        fqn: its name in the model.
    Returns:
        False for ``output`` alone.
    """
    return fqn != "output"


def build_model(args: TrainArgs, recipe: str, device: torch.device,
                mesh: DeviceMesh | None = None) -> nn.Module:  # fmt: skip
    """The seeded Llama of ``args`` (initialised on CPU, so every device and every run
    starts from the same weights), on ``device``, in ``recipe``: converted to MXLinear
    (all linears but ``output``) on one process, ``mx_nn.parallelize``-d on a mesh.

    Args:
        args: the run's flags (model shape, seed).
        recipe: an mx_nn recipe, or ``"bf16"`` (no MX layers).
        device: where the model runs.
        mesh: the run's (dp, tp) mesh, or None on one process.
    Returns:
        The model (parallelized on a mesh).
    """
    torch.manual_seed(args.seed)
    model = Llama(args.model_config).to(device)
    if mesh is not None:
        return apply_parallel(model, mesh, recipe)
    if recipe != BF16:
        mx_nn.convert(model, recipe, filter_fn=mx_filter)
    return model


def learning_rate(args: TrainArgs, step: int) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to lr / 10."""
    warmup = max(1, args.steps // 20)
    if step <= warmup:
        return args.lr * step / warmup
    progress = (step - warmup) / max(1, args.steps - warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _logits(model: nn.Module, inputs: torch.Tensor, autocast: bool) -> torch.Tensor:
    with torch.autocast(inputs.device.type, torch.bfloat16, enabled=autocast):
        logits = model(inputs)
    return _full(logits).float()


def loss_of(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, autocast: bool = True
) -> torch.Tensor:
    """Mean cross-entropy in nats per token, logits under bf16 autocast (unless
    ``autocast`` is off: fp32), loss in fp32."""
    return F.cross_entropy(_logits(model, inputs, autocast).flatten(0, 1), targets.flatten())


def _train_step(model, optimizer, inputs, targets, autocast: bool) -> float:
    loss = loss_of(model, inputs, targets, autocast)
    loss.backward()
    # The norm is of the whole gradient (all ranks'): every rank takes the same branch.
    grad_norm = _full(nn.utils.clip_grad_norm_(model.parameters(), 1.0)).item()
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(loss.item(), grad_norm)  # before the optimizer applies it
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


@torch.no_grad()
def evaluate(model: nn.Module, batches, device: torch.device, autocast: bool = True,
             mesh: DeviceMesh | None = None) -> float:  # fmt: skip
    """Held-out loss (nats per token) over ``batches`` of (inputs, targets), int64
    [rows, seq]: each data-parallel rank of ``mesh`` computes its share of each batch
    (:func:`~mx_nn.train.distributed.dp_shard`), and the sums meet in one all-reduce."""
    total, count = 0.0, 0.0
    for inputs, targets in batches:
        rows, weight = dp_shard(len(inputs), mesh)
        targets = targets[rows].to(device)
        logits = _logits(model, inputs[rows].to(device), autocast)
        per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        per_row = per_token.view(targets.shape).double().sum(1).cpu()
        total += (per_row * weight).sum().item()
        count += weight.sum().item() * targets.shape[1]
    total, count = sum_over_dp([total, count], mesh)
    return total / count


def _peak_memory(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu process RSS"


def train_run(args: TrainArgs, run_index: int, data: ByteData, device: torch.device, *,
              mesh: DeviceMesh | None, ckpt: Path, done: list[RunResult], stop: StopFlag,
              resume: Path | None = None) -> tuple[RunResult, nn.Module]:  # fmt: skip
    """Train run ``run_index`` of ``args.runs``.

    Checkpoints into ``ckpt`` (:func:`mx_nn.train.checkpoint.save`) every
    ``args.save_every`` steps, when the run finishes, and when ``stop`` is requested
    (then raises :class:`TrainingInterrupted`) or an exception stops it on one process
    (then re-raises; not when the optimizer was mid-update, nor under torchrun, where
    the other ranks could not join the save). A non-finite loss or gradient norm raises
    :class:`~mx_nn.train.guard.TrainingDiverged` and saves nothing.

    Args:
        args: the run's flags.
        run_index: which of ``args.runs`` (the bf16 baseline first, with ``--compare``).
        data: the corpus and its batches.
        device: this rank's device.
        mesh: the run's (dp, tp) mesh, or None on one process.
        ckpt: ``<out>/checkpoint``.
        done: the results of the runs before this one (saved with each checkpoint).
        stop: the SIGINT/SIGTERM flag.
        resume: a checkpoint generation of this run to continue from, or None.
    Returns:
        ``(result, model)``: the run's :class:`RunResult` and its (unwrapped) model.
    Raises:
        TrainingInterrupted: ``stop`` was requested; a checkpoint holds the run.
        TrainingDiverged: a non-finite loss, gradient norm, held-out loss or parameter.
        CheckpointError: a checkpoint cannot be written.
    """
    recipe = args.runs[run_index]
    model = build_model(args, recipe, device, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.01)  # fmt: skip
    updating = [False]  # an exception inside optimizer.step leaves it half applied
    optimizer.register_step_pre_hook(lambda *_: updating.__setitem__(0, True))
    optimizer.register_step_post_hook(lambda *_: updating.__setitem__(0, False))
    result, step, interval = RunResult(recipe=recipe), 0, []
    saved_at = None  # (step, evaluations) the newest checkpoint of this run holds
    if resume is not None:
        state = checkpoint.load(resume, model, optimizer)
        checkpoint.set_rng_state(state["rng"])
        result, step, interval = RunResult(**state["result"]), state["step"], state["interval"]
        saved_at = (step, len(result.steps))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    forward = torch.compile(model) if args.compile else model
    heldout = data.heldout_batches(args.batch)
    rows, _ = dp_shard(args.batch, mesh)  # --batch is a multiple of dp: no padding
    eval_every = max(1, args.steps // EVALS)

    def save() -> Path | None:
        nonlocal saved_at
        if saved_at == (step, len(result.steps)):
            return checkpoint.latest(ckpt)  # nothing new since the last save or the load
        if max_over_ranks(float(not all_finite(model)), mesh):
            raise TrainingDiverged(
                recipe,
                step,
                "a parameter is not finite after the update",
                applied=True,
                checkpoint=checkpoint.latest(ckpt),
            )
        peak, kind = _peak_memory(device)
        peak = max_over_ranks(peak, mesh)
        result.peak_memory_mib, result.memory_kind = max(result.peak_memory_mib, peak), kind
        path = checkpoint.save(ckpt, model, optimizer, {
            "args": args.to_dict(), "data_sha256": data.sha256, "run_index": run_index,
            "step": step, "done": [r.to_dict() for r in done], "result": result.to_dict(),
            "interval": list(interval), "rng": checkpoint.rng_state(),
        }, tag=f"{recipe}-step{step:06d}")  # fmt: skip
        saved_at = (step, len(result.steps))
        return path

    def maybe_evaluate() -> float | None:
        if (step % eval_every and step != args.steps) or step in result.steps:
            return None
        held = evaluate(forward, heldout, device, args.autocast, mesh)
        if not math.isfinite(held):  # the same on every rank: the sums met in all-reduce
            first_rows = heldout[0][0][dp_shard(len(heldout[0][0]), mesh)[0]].to(device)
            raise diverged(step, f"held-out loss {held}", first_rows, applied=True)
        train = sum(interval) / len(interval) if interval else math.nan
        result.steps.append(step)
        result.train_loss.append(train)
        result.heldout_loss.append(held)
        interval.clear()
        return held

    def diverged(at: int, what: str, batch: torch.Tensor, *, applied: bool) -> TrainingDiverged:
        # A second forward on the batch that went non-finite, with hooks, names the module.
        try:
            module, located = first_nonfinite_module(model, batch, args.autocast, mesh), True
        except Exception:
            logger.exception("mx-train: could not locate the non-finite output")
            module, located = None, False
        return TrainingDiverged(recipe, at, what, applied=applied, module=module,
                                located=located, checkpoint=checkpoint.latest(ckpt))  # fmt: skip

    progress = Progress(recipe, args.steps, start=step, enabled=is_main())
    first, stopping = True, False
    try:
        if step:
            maybe_evaluate()  # a crash may have come between a step and its evaluation
        while step < args.steps:
            if stopping:
                raise TrainingInterrupted(recipe, step, save() or ckpt)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(args, step + 1)
            inputs, targets = data.train_batch(step + 1, args.batch, args.seed)
            inputs, targets = inputs[rows].to(device), targets[rows].to(device)
            t0 = time.perf_counter()
            try:
                loss = _train_step(forward, optimizer, inputs, targets, args.autocast)
            except NonFiniteError as e:  # the parameters are as before the step
                what = f"loss {e.loss}, gradient norm {e.grad_norm}"
                raise diverged(step + 1, what, inputs, applied=False) from None
            seconds = time.perf_counter() - t0
            loss, stopping = agree_step(loss, stop.requested, mesh)
            step += 1
            if not math.isfinite(loss):  # an inf loss with a finite gradient
                raise TrainingDiverged(recipe, step, f"loss {loss}", applied=True,
                                       checkpoint=checkpoint.latest(ckpt))  # fmt: skip
            interval.append(loss)
            if not first or args.steps == 1:
                result.tokens += args.batch * args.seq
                result.seconds += seconds
            first = False
            held = maybe_evaluate()
            progress.update(step, loss, args.batch * args.seq / seconds, held)
            if args.save_every and step % args.save_every == 0 and step < args.steps:
                save()
    except (TrainingInterrupted, TrainingDiverged, CheckpointError, KeyboardInterrupt):
        raise
    except Exception:
        if mesh is not None or updating[0]:
            why = "under torchrun" if mesh is not None else "inside the optimizer step"
            logger.exception("mx-train: %s crashed after step %d %s; not saving it, the "
                             "newest checkpoint stays", recipe, step, why)  # fmt: skip
            raise
        logger.exception("mx-train: %s crashed after step %d; saving a checkpoint", recipe, step)
        save()
        raise
    finally:
        progress.close()
    save()
    return result, model
