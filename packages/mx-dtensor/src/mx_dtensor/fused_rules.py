"""Sharding rules of the fused producers (``mx_kernels.norm_cast``, ``mx_kernels.swiglu_cast``):
each runs on the local shards with no communication, or is refused.

- ``rms_norm_quantize(x, weight, ...)`` -> y, rstd, codes, scales: the norm reduces along
  the last dim, so x may be sharded along its other dims only (sequence or batch
  shards); the weight must be replicated. Every output is sharded as x (rstd lacks the
  last dim).
- ``rms_norm_backward(dy, x, weight, rstd)`` -> dx, dweight: dx sharded as x; dweight a
  partial sum over the mesh dims that shard x (each rank sums its own rows), else
  replicated.
- ``swiglu_quantize(gate, up, ...)`` -> h, codes, scales: elementwise, then a cast
  along the last dim: gate and up placed alike, a shard of the last dim holding whole
  blocks (the intermediate dim under tensor parallelism); outputs sharded as gate.
- The ``_both`` forms add the columnwise cast of the [M, K] fold: like ``quantize_both``
  (:mod:`mx_dtensor.sharding`), a sharded x is 2-D and a shard of M holds whole blocks;
  the transposed outputs are sharded along the other dim.

No Partial input is taken (the amax and the norm of a partial sum are not those of the
sum). Errors are :class:`mx_dtensor.shard_checks.MXShardingError`, naming the op, the
argument, its placement and what is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor import Partial, Replicate
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor.placement_types import Placement

import mx_kernels.norm_cast  # noqa: F401  (defines the ops registered here)
import mx_kernels.swiglu_cast  # noqa: F401
from mx_dtensor.shard_checks import (
    MXShardingError,
    check_partial,
    check_whole_blocks,
    normalized,
    placed_as,
    sharded_dim,
    where,
)
from mx_dtensor.sharding import register_rule

__all__ = ["FUSED_OPS"]

FUSED_OPS: tuple[str, ...] = (
    "rms_norm_quantize",
    "rms_norm_quantize_both",
    "rms_norm_backward",
    "swiglu_quantize",
    "swiglu_quantize_both",
)
"""The fused producers' ``torch.ops.mx`` op names that have a rule here."""

_SAME, _T = (), (1, 0)  # outputs laid out as x, and as x^T (2-D x)


def _dims(spec: DTensorSpec) -> list[int | None]:
    ndim = len(spec.shape)
    return [sharded_dim(normalized(p, ndim)) for p in spec.placements]


def _same_placements(op: str, names: Sequence[str], specs: Sequence[DTensorSpec]) -> None:
    first = specs[0]
    for name, spec in zip(names[1:], specs[1:], strict=True):
        if tuple(spec.shape) != tuple(first.shape) or spec.placements != first.placements:
            raise MXShardingError(
                f"{op}: {name} (shape {tuple(spec.shape)}, placed {tuple(spec.placements)}) "
                f"must have the shape and placements of {names[0]} (shape "
                f"{tuple(first.shape)}, placed {tuple(first.placements)})"
            )


def _replicated(op: str, name: str, spec: DTensorSpec) -> None:
    for i, p in enumerate(spec.placements):
        if not p.is_replicate():
            raise MXShardingError(
                f"{where(op, name, spec, i)}: the norm's weight must be Replicate (each rank "
                "scales whole rows)"
            )


def _not_along_last(op: str, name: str, spec: DTensorSpec, why: str) -> None:
    last = len(spec.shape) - 1
    for i, d in enumerate(_dims(spec)):
        if d == last:
            raise MXShardingError(f"{where(op, name, spec, i)}: sharded along the last dim, {why}")


def _both_checks(op: str, name: str, spec: DTensorSpec, block_size: int) -> None:
    if any(d is not None for d in _dims(spec)):
        if len(spec.shape) != 2:
            raise MXShardingError(
                f"{op}: {name} of shape {tuple(spec.shape)} placed {tuple(spec.placements)}: "
                "the columnwise cast of a sharded input needs it 2-D [M, K] (fold the "
                "leading dims first)"
            )
        check_whole_blocks(op, name, spec, 0, block_size)


def _outputs(spec: DTensorSpec, kinds: Sequence[Sequence[int]]) -> list[tuple[Placement, ...]]:
    """Placements of outputs laid out as x (``_SAME``) or as x^T (``_T``, 2-D x)."""
    return [placed_as(spec, kind) for kind in kinds]


_CAST_KINDS = {False: (_SAME, _SAME), True: (_SAME, _T, _T, _SAME)}  # as quantize_rowwise/_both


def _norm_rule(colwise: bool):
    def rule(op: str, specs: list[DTensorSpec], args: tuple) -> list[tuple[Placement, ...]]:
        x, weight = specs
        block_size = args[4]  # x, weight, eps, fmt, block_size, scale_mode, backend
        for name, spec in (("x", x), ("weight", weight)):
            check_partial(op, name, spec)
        _replicated(op, "weight", weight)
        _not_along_last(op, "x", x, "which the norm reduces over (gather it first)")
        if colwise:
            _both_checks(op, "x", x, block_size)
        y, rstd = _outputs(x, (_SAME, _SAME))  # rstd: x's leading dims, sharded as x
        return [y, rstd, *_outputs(x, _CAST_KINDS[colwise])]

    return rule


def _norm_backward_rule(op: str, specs: list[DTensorSpec], args: tuple) -> list[tuple]:
    dy, x, weight, rstd = specs
    for name, spec in (("dy", dy), ("x", x), ("weight", weight), ("rstd", rstd)):
        check_partial(op, name, spec)
    _same_placements(op, ("x", "dy"), (x, dy))
    _replicated(op, "weight", weight)
    _not_along_last(op, "x", x, "which the norm reduces over")
    if rstd.placements != x.placements:
        raise MXShardingError(
            f"{op}: rstd placed {tuple(rstd.placements)} must be placed as x "
            f"({tuple(x.placements)}), as rms_norm_quantize returns it"
        )
    (dx,) = _outputs(x, (_SAME,))
    dw = tuple(Replicate() if d is None else Partial("sum") for d in _dims(x))
    return [dx, dw]


def _swiglu_rule(colwise: bool):
    def rule(op: str, specs: list[DTensorSpec], args: tuple) -> list[tuple[Placement, ...]]:
        gate, up = specs
        block_size = args[3]  # gate, up, fmt, block_size, scale_mode, backend
        for name, spec in (("gate", gate), ("up", up)):
            check_partial(op, name, spec)
        _same_placements(op, ("gate", "up"), (gate, up))
        check_whole_blocks(op, "gate", gate, len(gate.shape) - 1, block_size)
        if colwise:
            _both_checks(op, "gate", gate, block_size)
        return [*_outputs(gate, (_SAME,)), *_outputs(gate, _CAST_KINDS[colwise])]

    return rule


_RULES = {
    "rms_norm_quantize": (_norm_rule(False), 2),
    "rms_norm_quantize_both": (_norm_rule(True), 2),
    "rms_norm_backward": (_norm_backward_rule, 4),
    "swiglu_quantize": (_swiglu_rule(False), 2),
    "swiglu_quantize_both": (_swiglu_rule(True), 2),
}
assert tuple(_RULES) == FUSED_OPS
for _name, (_rule, _static) in _RULES.items():
    register_rule(getattr(torch.ops.mx, _name).default, f"mx::{_name}", _rule, _static)
