"""DTensor sharding rules for every ``mx::`` op of mx-kernels.

Importing this module registers one rule per op with DTensor's sharding propagator.
Rules are per mesh dim (a 2-D mesh takes each dim's rule in turn); ``bs`` is the op's
``block_size`` (32 for ``scaled_mm``); x is ``[..., K]`` (rowwise) or ``[M, K]``:

=========================  ======================  ==========================================
op                         input on a mesh dim     outputs on that mesh dim
=========================  ======================  ==========================================
``quantize_rowwise``       R / Shard(d)            (qdata, scale): R / Shard(d)
``fake_quantize_rowwise``  R / Shard(d)            R / Shard(d)
``quantize_colwise``       R / S(0) / S(1)         (qdata_t [K, M], scale [M/bs, K]):
                                                   R / (S(1), S(0)) / (S(0), S(1))
``fake_quantize_colwise``  R / S(0) / S(1)         R / S(0) / S(1)
``quantize_both``          R / S(0) / S(1)         (q_row, s_row [K/bs, M], q_col_t,
                                                   s_col [M/bs, K]): R / (S(0), S(1), S(1),
                                                   S(0)) / (S(1), S(0), S(0), S(1))
``fake_quantize_both``     R / S(0) / S(1)         (row, col): R / S(0) / S(1)
``fake_quantize_rowwise_`` R / S(0) / S(1)         (row, qdata_t [K, M], scale [M/bs, K]):
``quantize_colwise``                               R / (S(0), S(1), S(0)) / (S(1), S(0),
                                                   S(1))
``dequantize_rowwise``     qdata and scale alike:  R / Shard(d)
                           R / Shard(d)
``scaled_mm`` (a @ b^T)    (R, R)                  R
                           (S(0), R)               S(0)
                           (R, S(0))               S(1)
                           (S(1), S(1))            Partial(sum)
=========================  ======================  ==========================================

(``quantize_both``'s s_row and both colwise ops' scales are the ops' contiguous
buffers; the public functions return their transposes, which DTensor's ``t()`` maps.
With ``scale_layout="blocked"`` the quantize ops take only a Replicate x.
The fake-quantize ops' ``inline`` overloads have their default overload's rule.)

One aten op MXLinear reaches has no DTensor rule in torch 2.11-2.13 and gets the same
kind of rule here: ``aten.mm.dtype`` (``mx_kernels.bf16_gemm`` on CUDA when the result
is not bf16), as DTensor's mm: (R, R) -> R, (S(0), R) -> S(0), (R, S(1)) -> S(1),
(S(1), S(0)) -> Partial(sum). It is registered only where torch has no rule of its own.

- A Shard of a blocked dim (the last dim of a rowwise cast, M of a columnwise one, K of
  ``scaled_mm`` and ``dequantize_rowwise``) must give every rank whole blocks: each
  local size a multiple of ``bs``; a ``_StridedShard`` of it (what DTensor makes of
  ``[B, S, K] -> [B * S, K]`` with S sharded) must leave contiguous runs of whole
  blocks (S per rank a multiple of ``bs``). Other dims may be sharded unevenly, or
  strided.
- A Partial input is refused: the amax of a partial sum is not the amax of the sum,
  and partial codes are not codes of the sum. Reduce it first.
- Anything else raises :class:`MXShardingError` (a ValueError naming the op, the input,
  the dim, the global and local sizes and the mesh dim's size) while the sharding is
  propagated, that is before any communication. A rule never asks DTensor to
  redistribute an input: the one strategy it returns takes the inputs as they are. (A
  ``register_sharding`` rule lists acceptable placements and DTensor silently
  redistributes any other input to the cheapest of them.)

The local sizes, the whole-block and Partial checks and :class:`MXShardingError` are
:mod:`mx_dtensor.shard_checks`'s; ``MXShardingError``, ``local_sizes`` and
``split_block_reason`` are importable from here too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo
from torch.distributed.tensor.placement_types import Placement

import mx_kernels  # noqa: F401  (defines the mx:: ops registered here)
from mx_core import get_format
from mx_dtensor.shard_checks import (
    MXShardingError,
    check_partial,
    check_whole_blocks,
    local_sizes,
    moved,
    normalized,
    placed_as,
    sharded_dim,
    split_block_reason,
    where,
)

__all__ = ["MX_OPS", "MXShardingError", "local_sizes", "register_rule", "split_block_reason"]

MX_OPS: tuple[str, ...] = (
    "quantize_rowwise",
    "quantize_colwise",
    "quantize_both",
    "fake_quantize_rowwise",
    "fake_quantize_colwise",
    "fake_quantize_both",
    "fake_quantize_rowwise_quantize_colwise",
    "dequantize_rowwise",
    "scaled_mm",
    "rms_norm_quantize",
    "rms_norm_quantize_both",
    "rms_norm_backward",
    "swiglu_quantize",
    "swiglu_quantize_both",
)
"""Names of the ``torch.ops.mx`` ops that have a rule in mx-dtensor (every op of
mx-kernels, each overload: the fake-quantize ops' ``inline`` ones too): here, and the
fused producers' in :mod:`mx_dtensor.fused_rules`."""

_GEMM_BLOCK = 32


def _cast_rule(blocked: Sequence[int], out_dims: Sequence[Sequence[int]]):
    """The rule of a cast of x blocked along ``blocked`` dims (-1: the last); output j
    takes x's dim d as its dim ``out_dims[j][d]``, or as dim d where that is empty. (The
    ops' fake impls, which run first, refuse an x of the wrong rank.)"""

    def rule(op: str, specs: list[DTensorSpec], args: tuple) -> list[tuple[Placement, ...]]:
        (x,) = specs
        block_size = args[2]  # args: x, fmt, block_size, scale_mode, backend[, scale_layout]
        ndim = len(x.shape)
        check_partial(op, "x", x)
        if len(args) > 5 and args[5] != "plain" and not all(p.is_replicate() for p in x.placements):
            # The blocked layout pads rows to 128 and interleaves them by tiles: the blocked
            # scales of a shard are not a shard of the blocked scales.
            raise MXShardingError(
                f"{op}: scale_layout={args[5]!r} with x (shape {tuple(x.shape)}) placed "
                f"{tuple(x.placements)}: blocked scales have a rule only for a Replicate x; "
                "cast the local tensor (x.to_local()) or use scale_layout='plain'"
            )
        for d in blocked:
            check_whole_blocks(op, "x", x, d % ndim, block_size)
        return [placed_as(x, dims) for dims in out_dims]

    return rule


_SAME = ()  # an output laid out as x
_T = (1, 0)  # an output laid out as x^T

_CAST_RULES = {
    "quantize_rowwise": _cast_rule((-1,), (_SAME, _SAME)),
    "fake_quantize_rowwise": _cast_rule((-1,), (_SAME,)),
    "quantize_colwise": _cast_rule((0,), (_T, _SAME)),
    "fake_quantize_colwise": _cast_rule((0,), (_SAME,)),
    "quantize_both": _cast_rule((0, 1), (_SAME, _T, _T, _SAME)),
    "fake_quantize_both": _cast_rule((0, 1), (_SAME, _SAME)),
    "fake_quantize_rowwise_quantize_colwise": _cast_rule((0, 1), (_SAME, _T, _SAME)),
}


def _dequantize_rule(op: str, specs: list[DTensorSpec], args: tuple) -> list[tuple]:
    q, s = specs
    fmt, block_size = args[2], args[3]
    ndim = len(q.shape)
    if len(s.shape) != ndim:
        raise MXShardingError(f"{op}: qdata and scale ranks differ: {q.shape}, {s.shape}")
    check_partial(op, "qdata", q)
    check_partial(op, "scale", s)
    pq = tuple(normalized(p, ndim) for p in q.placements)
    ps = tuple(normalized(p, ndim) for p in s.placements)
    for i, (a, b) in enumerate(zip(pq, ps, strict=True)):
        if a != b:
            raise MXShardingError(
                f"{where(op, 'qdata', q, i)} is {a} but scale is {b}: qdata and scale must "
                "have the same placements"
            )
    per = 2 if get_format(fmt).is_packed else 1
    check_whole_blocks(op, "qdata", q, ndim - 1, block_size, per)
    kq = local_sizes(q.shape[-1], pq, q.mesh.shape, ndim - 1)
    ks = local_sizes(s.shape[-1], ps, s.mesh.shape, ndim - 1)
    if any(a * per != b * block_size for a, b in zip(kq, ks, strict=True)):
        raise MXShardingError(
            f"{where(op, 'qdata', q, 0)}: local qdata sizes {kq} along the last dim do not "
            f"match the local scale sizes {ks} (block size {block_size})"
        )
    return [pq]


def _scaled_mm_rule(op: str, specs: list[DTensorSpec], args: tuple) -> list[tuple]:
    """An operand whose scales are in the blocked layout (``scale_layout``, args 8 and 9)
    takes only Replicate, it and its scales: the blocked scales of a shard are not a
    shard of the blocked scales (rows padded to 128 and interleaved by tiles)."""
    a, a_s, b, b_s = specs
    a_fmt, b_fmt = args[2], args[5]
    layouts = [args[i] if len(args) > i else "plain" for i in (8, 9)]
    for name, spec in (("a", a), ("a_scale", a_s), ("b", b), ("b_scale", b_s)):
        check_partial(op, name, spec)
    for name, data, scale, layout in (("a", a, a_s, layouts[0]), ("b", b, b_s, layouts[1])):
        if layout == "plain":
            for arg, spec in ((name, data), (f"{name}_scale", scale)):
                if len(spec.shape) != 2:
                    shape = tuple(spec.shape)
                    raise MXShardingError(f"{op}: {arg} must be 2-D, got shape {shape}")
        elif not all(p.is_replicate() for p in (*data.placements, *scale.placements)):
            raise MXShardingError(
                f"{op}: {name}_scale is in the {layout!r} layout, which has no rule for a "
                f"shard: {name} (shape {tuple(data.shape)}) is placed {tuple(data.placements)} "
                f"and {name}_scale {tuple(scale.placements)}, both must be Replicate; pass "
                "plain scales ([rows, K // 32], scale_layout='plain') to shard"
            )
        elif len(data.shape) != 2:
            raise MXShardingError(f"{op}: {name} must be 2-D, got shape {tuple(data.shape)}")
    pa = tuple(normalized(p, 2) for p in a.placements)
    pb = tuple(normalized(p, 2) for p in b.placements)
    for name, data, scale, spec in (("a", pa, a_s, a), ("b", pb, b_s, b)):
        for i, (p, q) in enumerate(
            zip(data, (normalized(p, 2) for p in scale.placements), strict=True)
        ):
            if p != q:
                raise MXShardingError(
                    f"{where(op, name, spec, i)} is {p} but {name}_scale is {q}: an operand "
                    "and its scales must have the same placements"
                )
    for name, spec, fmt in (("a", a, a_fmt), ("b", b, b_fmt)):
        per = 2 if get_format(fmt).is_packed else 1
        check_whole_blocks(op, name, spec, 1, _GEMM_BLOCK, per)
    out: list[Placement] = []
    for i, (p, q) in enumerate(zip(pa, pb, strict=True)):
        da, db = sharded_dim(p), sharded_dim(q)
        if da is None and db is None:
            out.append(Replicate())
        elif da == 0 and db is None:
            out.append(p)
        elif da is None and db == 0:
            out.append(moved(q, 1))
        elif da == 1 and db == 1 and p == q:  # the same split of K (strided alike)
            out.append(Partial("sum"))
        else:
            raise MXShardingError(
                f"{where(op, 'a', a, i)} is {p} and b (shape {tuple(b.shape)}) is {q}: no "
                "rule for this pair (a @ b^T takes (R, R) -> R, (S(0), R) -> S(0), "
                "(R, S(0)) -> S(1), (S(1), S(1)) -> Partial); redistribute first"
            )
    return [tuple(out)]


def _mm_dtype_rule(op: str, specs: list[DTensorSpec], args: tuple) -> list[tuple]:
    """``aten.mm.dtype`` (a [M, K] @ b [K, N] with an fp32 result), which
    ``mx_kernels.bf16_gemm`` runs on CUDA for non-bf16 outputs: DTensor's mm rules."""
    a, b = specs
    for name, spec in (("a", a), ("b", b)):
        check_partial(op, name, spec)
    out: list[Placement] = []
    for i, (p, q) in enumerate(zip(a.placements, b.placements, strict=True)):
        da, db = sharded_dim(normalized(p, 2)), sharded_dim(normalized(q, 2))
        if da is None and db is None:
            out.append(Replicate())
        elif da == 0 and db is None:
            out.append(p)
        elif da is None and db == 1:
            out.append(q)
        elif da == 1 and db == 0 and type(p) is Shard and type(q) is Shard:
            out.append(Partial("sum"))
        else:
            raise MXShardingError(
                f"{where(op, 'a', a, i)} is {p} and b is {q}: no rule for this pair (a @ b "
                "takes (R, R), (S(0), R), (R, S(1)), (S(1), S(0))); redistribute first"
            )
    return [tuple(out)]


def register_rule(op, name: str, rule: Callable, static_argnum: int) -> None:
    """Register ``rule`` as the DTensor sharding strategy of ``op``: one strategy, the
    inputs' own placements in, the rule's out, no redistribution.

    Args:
        op: the op overload (``torch.ops.mx.scaled_mm.default``).
        name: the op's name in messages (``"mx::scaled_mm"``).
        rule: ``rule(name, input_specs, args_schema) -> [placements per output]``,
            raising :class:`MXShardingError` for placements it has no rule for.
        static_argnum: the index of the op's first non-tensor argument.
    """

    def strategy(op_schema: OpSchema) -> OpStrategy:
        inputs = [a for a in op_schema.args_schema if isinstance(a, OpStrategy)]
        for s in inputs:
            if len(s.strategies) != 1:
                raise MXShardingError(
                    f"{name}: an input offers {len(s.strategies)} placements; the mx rules "
                    "take one placement per input (the DTensor it is)"
                )
        specs = [s.strategies[0].output_spec for s in inputs]
        if any(not isinstance(a, DTensorSpec) for a in specs):
            raise MXShardingError(f"{name}: tensor inputs must all be DTensors")
        outs = [DTensorSpec(specs[0].mesh, p) for p in rule(name, specs, op_schema.args_schema)]
        return OpStrategy(
            [
                OpSpec(
                    output_specs=tuple(outs) if len(op._schema.returns) > 1 else outs[0],
                    input_specs=specs,
                    redistribute_cost=[[0.0] for _ in specs],
                )
            ]
        )

    DTensor._op_dispatcher.sharding_propagator.register_op_strategy(
        op, strategy, RuntimeSchemaInfo(static_argnum=static_argnum)
    )


for _name, _rule in _CAST_RULES.items():
    _packet = getattr(torch.ops.mx, _name)
    for _overload in _packet.overloads():  # the fake-quantize ops' "inline" too
        register_rule(getattr(_packet, _overload), f"mx::{_name}", _rule, static_argnum=1)
register_rule(
    torch.ops.mx.dequantize_rowwise.default, "mx::dequantize_rowwise", _dequantize_rule, 2
)
register_rule(torch.ops.mx.scaled_mm.default, "mx::scaled_mm", _scaled_mm_rule, static_argnum=2)

_propagator = DTensor._op_dispatcher.sharding_propagator
if not any(
    torch.ops.aten.mm.dtype in table
    for table in (
        _propagator.op_strategy_funcs,
        getattr(_propagator, "op_single_dim_strategy_funcs", {}),
        _propagator.op_to_rules,
    )
):  # torch 2.11-2.13 have no rule for it; a later torch's own rule wins
    register_rule(torch.ops.aten.mm.dtype, "aten.mm.dtype", _mm_dtype_rule, static_argnum=2)
