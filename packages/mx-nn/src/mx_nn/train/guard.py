"""The non-finite guard: a NaN or inf loss or gradient norm stops the run before the
optimizer applies it and before any checkpoint could hold it, naming the step and the
first module whose forward output went non-finite."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

__all__ = ["DIVERGED", "NonFiniteError", "TrainingDiverged", "all_finite",
           "first_nonfinite_module", "forward_hooked"]  # fmt: skip

DIVERGED = 3
"""Exit status of a run stopped by a non-finite loss or gradient norm."""


class NonFiniteError(Exception):
    """A step's loss or gradient norm is NaN or inf (raised by the step, before the
    optimizer applies that gradient)."""

    def __init__(self, loss: float, grad_norm: float) -> None:
        super().__init__(f"loss {loss}, gradient norm {grad_norm}")
        self.loss, self.grad_norm = loss, grad_norm


class TrainingDiverged(Exception):
    """A run stopped at a non-finite loss, gradient norm or parameter; no checkpoint
    holds it (exit status :data:`DIVERGED`)."""

    def __init__(self, recipe: str, step: int, what: str, *, applied: bool,
                 module: str | None = None, located: bool = False,
                 checkpoint: Path | None = None) -> None:  # fmt: skip
        where = ""
        if module is not None:
            where = f"; the first module whose forward output is not finite: {module}"
        elif located:
            where = ("; every module's forward output is finite (the non-finite values "
                     "arose in the backward pass)")  # fmt: skip
        fate = "applied but not saved" if applied else "not applied"
        kept = f"the newest checkpoint, {checkpoint}, is from before it" if checkpoint \
            else "no checkpoint was written"  # fmt: skip
        super().__init__(f"{recipe} step {step}: {what}{where}. The step was {fate}; {kept}. "
                         "Lower --lr, or try --no-autocast or another --recipe")  # fmt: skip
        self.recipe, self.step, self.module = recipe, step, module


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _finite(value) -> bool:
    if isinstance(value, torch.Tensor):
        t = _local(value)
        return not t.is_floating_point() or bool(torch.isfinite(t).all())
    if isinstance(value, tuple | list):
        return all(_finite(v) for v in value)
    return True


def all_finite(model: nn.Module) -> bool:
    """Whether every parameter is finite.

    Args:
        model: the model (DTensor parameters: this rank's shard of each).
    Returns:
        True when no floating-point parameter holds a NaN or inf.
    """
    return all(_finite(p.detach()) for p in model.parameters())


@torch.no_grad()
def first_nonfinite_module(model: nn.Module, inputs: torch.Tensor, autocast: bool,
                           mesh: DeviceMesh | None = None) -> str | None:  # fmt: skip
    """Run ``model`` once on ``inputs`` (token ids, int64 [batch, seq]) with forward
    hooks on every module and return the first module path, in the order outputs are
    made, whose output holds a NaN or inf ("<model>" for the logits alone); None when
    all are finite. On a mesh every rank runs it (the forward's collectives need all)
    and the answer is the lowest rank's find, e.g. ``"layers.0.attention (rank 1)"``.

    Args:
        model: the model.
        inputs: token ids, int64 [batch, seq].
        autocast: run under bf16 autocast, as the step did.
        mesh: the run's mesh, or None on one process.
    Returns:
        The module path (``"<model>"`` for the logits alone), or None.
    """
    found: list[str] = []

    def hook(fqn: str, module: nn.Module):
        def check(module, args, out) -> None:
            if not found and not _finite(out):
                found.append(fqn or "<model>")

        return check

    forward_hooked(model, inputs, autocast, hook)
    name = found[0] if found else None
    if mesh is None or not dist.is_initialized():
        return name
    names: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(names, name)
    return next((f"{n} (rank {r})" for r, n in enumerate(names) if n is not None), None)


def forward_hooked(model: nn.Module, inputs: torch.Tensor, autocast: bool, hook_for) -> None:
    """One forward of ``model`` on ``inputs`` (under bf16 autocast unless ``autocast`` is
    off) with the forward hook ``hook_for(fqn, module)`` returns (None: none) on each of
    its modules; every hook is removed afterwards, also when the forward raises.

    Args:
        model: the model.
        inputs: token ids, int64 [batch, seq].
        autocast: run under bf16 autocast.
        hook_for: ``(fqn, module) -> forward hook or None``, asked once per module.
    """
    handles = []
    try:
        for fqn, module in model.named_modules():
            hook = hook_for(fqn, module)
            if hook is not None:
                handles.append(module.register_forward_hook(hook))
        with torch.autocast(inputs.device.type, torch.bfloat16, enabled=autocast):
            model(inputs)
    finally:
        for h in handles:
            h.remove()
