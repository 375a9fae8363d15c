"""``mx_all_gather``: the sequence-parallel all-gather as a rowwise MX cast.

Sequence parallelism gathers each MLP's and attention's input from ``Shard(1)`` (tokens
split across ranks) to ``Replicate()`` once for all its columnwise linears. Here each
rank casts its local shard rowwise (blocks along the hidden dim, the last one) and the
all-gather moves the fp8 codes and E8M0 scales (as uint8: 1 + 1/32 bytes an element,
0.516x bf16), which every rank then decodes.

Why the forward stays exact: the blocks of a rowwise cast lie along the hidden dim, so
casting a sequence shard gives the rows the cast of the gathered tensor would; and an MX
linear casting the decoded values again along the same blocks gets the same values back
(``tests/test_styles_mx.py`` checks both, every scale mode). So the linears compute the
same outputs as with a high-precision gather.

Backward: the gather's gradient is reduce-scattered in the gradient's dtype (partial sums
need it), as PyTorch's sequence parallelism does. dW = dY^T X of each linear casts the
X it saved, here the decoded gathered input, along the tokens (columnwise): a second
cast of once-rounded values, so dW differs from the high-precision gather's by MX
rounding (the linears save what they would save anyway: no extra activation memory; no
all-gather in backward). The other collectives of a block (the rowwise outputs'
reduce-scatter and its backward all-gather) stay in high precision.

The styles' gathers (:func:`gather_replicated`) also hand the gathered cast to the hooks
of :func:`register_gather_hook`: layers that keep their input casts (``mx_nn``'s
linears) can take it instead of casting the decoded values again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.utils.hooks import RemovableHandle

import mx_kernels
from mx_core import CastSettings
from mx_dtensor.cast_args import add_cast_fields, cast_from_args

__all__ = ["GatheredCast", "gather_replicated", "mx_all_gather", "register_gather_hook"]


# torch 2.13 renamed these (same arguments); 2.11 has only the old names.
_all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
_reduce_scatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)


def _wait(t: torch.Tensor) -> torch.Tensor:
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


class _MXAllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mesh, dim, cast: CastSettings):
        kwargs = cast.as_kwargs()  # plain strings for the kernels' caches and ops
        qdata, scale = mx_kernels.quantize_rowwise(x, **kwargs)
        # gloo refuses float8 dtypes: the payload travels as bytes.
        codes = _wait(_all_gather(qdata.view(torch.uint8), dim, mesh))
        scales = _wait(_all_gather(scale.view(torch.uint8), dim, mesh))
        ctx.mesh, ctx.dim = mesh, dim
        codes, scales = codes.view(qdata.dtype), scales.view(scale.dtype)
        ctx.mark_non_differentiable(codes, scales)
        decoded = mx_kernels.dequantize_rowwise(
            codes, scales, kwargs["fmt"], block_size=cast.block_size, out_dtype=x.dtype,
            backend=kwargs["backend"],
        )  # fmt: skip
        return decoded, codes, scales

    @staticmethod
    def backward(ctx, grad, _codes, _scales):
        dim = ctx.dim
        out = _reduce_scatter(grad.contiguous(), "sum", dim, ctx.mesh)
        return _wait(out), None, None, None


def mx_all_gather(
    x: torch.Tensor,
    mesh: DeviceMesh,
    dim: int,
    *,
    cast: CastSettings | None = None,
    fmt: str | None = None,
    block_size: int | None = None,
    scale_mode: str | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """All-gather the local shards ``x`` [..., K] along ``dim`` over a 1-D ``mesh`` as a
    rowwise MX cast (codes + E8M0 scales), decoded to ``x.dtype`` after the gather.

    ``dim`` must not be the last one (the blocks run along it); K divisible by the block
    size. Backward: reduce-scatter of the gradient along ``dim`` in its dtype.

    Args:
        x: this rank's shard [..., K], fp32/bf16/fp16 (a plain tensor).
        mesh: the 1-D mesh to gather over.
        dim: the dim to gather along (negative counts from the end).
        cast: the rowwise cast (default ``CastSettings()``: fp8_e4m3, 32, rceil, auto).
        fmt, block_size, scale_mode, backend: the same given one by one, deprecated
            (a FutureWarning; not together with ``cast``).

    Returns:
        The gathered tensor, ``x``'s shape with ``dim`` times the mesh size, in x's
        dtype (the decoded cast: MX-rounded values).

    Raises:
        TypeError: ``cast`` and any of the four keywords both given.
        ValueError: ``dim`` is the last dim, or ``mesh`` is not 1-D.
    """
    cast = cast_from_args("mx_all_gather", cast, fmt=fmt, block_size=block_size,
                          scale_mode=scale_mode, backend=backend)  # fmt: skip
    dim = _gather_dim(x, mesh, dim)
    return _MXAllGather.apply(x, mesh, dim, cast)[0]


def _gather_dim(x: torch.Tensor, mesh: DeviceMesh, dim: int) -> int:
    dim = dim % x.ndim
    if dim == x.ndim - 1:
        raise ValueError(f"mx_all_gather: dim={dim} is the blocked (last) dim of {tuple(x.shape)}")
    if mesh.ndim != 1:
        raise ValueError(f"mx_all_gather needs a 1-D mesh, got {mesh.ndim}-D")
    return dim


@add_cast_fields  # fmt, block_size, scale_mode, backend read back from cast
class GatheredCast(NamedTuple):
    """An MX gather of the styles, as :func:`register_gather_hook`'s hooks see it."""

    decoded: DTensor
    """The ``Replicate()`` DTensor [..., K] handed to the module (the decoded cast)."""
    qdata: torch.Tensor
    """The gathered codes [..., K] (fp4: [..., K // 2] uint8), a local tensor."""
    scale: torch.Tensor
    """The gathered E8M0 scales [..., K // block_size], a local tensor."""
    cast: CastSettings
    """The settings of the cast that made ``qdata`` and ``scale``."""


_HOOKS: OrderedDict[int, Callable[[GatheredCast], None]] = OrderedDict()


def register_gather_hook(hook: Callable[[GatheredCast], None]) -> RemovableHandle:
    """Call ``hook(gathered)`` after every MX gather of the MX styles, in eager mode
    (not under torch.compile), before the gathered input reaches the module.

    For layers that keep the casts of their inputs (``mx_nn`` hands the gathered cast
    to its linears this way, so they skip recasting the decoded values along the same
    blocks, which would give them back unchanged).

    Args:
        hook: called with each gather's :class:`GatheredCast`; its return is ignored.

    Returns:
        A handle whose ``remove()`` unregisters it.
    """
    handle = RemovableHandle(_HOOKS)
    _HOOKS[handle.id] = hook
    return handle


def gather_replicated(
    x: torch.Tensor,
    mesh: DeviceMesh,
    dim: int,
    *,
    cast: CastSettings | None = None,
    fmt: str | None = None,
    block_size: int | None = None,
    scale_mode: str | None = None,
    backend: str | None = None,
    who: str,
) -> DTensor:
    """What the MX styles make of a ``Shard(dim) -> Replicate()`` redistribution: ``x``
    (this rank's shard, or a DTensor ``Shard(dim)``) gathered by :func:`mx_all_gather`
    into a ``Replicate()`` DTensor whose gradient is taken as a partial sum (a columnwise
    linear's dX) and reduce-scattered once.

    Args:
        x: this rank's shard [..., K], or a DTensor ``Shard(dim)`` of equal shards.
        mesh: the 1-D mesh to gather over.
        dim: the sharded dim (not the last one).
        cast: the rowwise cast (default ``CastSettings()``).
        fmt, block_size, scale_mode, backend: the same given one by one, deprecated
            (a FutureWarning; not together with ``cast``).
        who: the caller's name in warnings and errors.

    Returns:
        A ``Replicate()`` DTensor of the decoded gathered values, x's dtype (under
        autocast, the autocast dtype).

    Raises:
        TypeError: ``cast`` and any of the four keywords both given.
        ValueError: a DTensor not ``Shard(dim)``, or whose ``dim`` does not split
            evenly over ``mesh`` (the gather moves equal shards; pad the sequence).
    """
    cast = cast_from_args(who, cast, fmt=fmt, block_size=block_size, scale_mode=scale_mode,
                          backend=backend)  # fmt: skip
    if isinstance(x, DTensor):
        n, size = mesh.size(), x.shape[dim]
        if x.placements != (Shard(dim % x.ndim),):
            raise ValueError(
                f"{who}: expected a DTensor sharded as (Shard({dim}),) to gather, got "
                f"placements {x.placements} (input shape {tuple(x.shape)})"
            )
        if size % n:
            raise ValueError(
                f"{who}: the MX all-gather needs equal shards, got dim {dim} of size {size} "
                f"over {n} ranks (input shape {tuple(x.shape)}); pad it to a multiple of {n}"
            )
        x = x.to_local()
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        # The consuming linears cast their input to the autocast dtype before their MX
        # cast (as F.linear would): cast the same values here, or the gather's cast of
        # the higher-precision values would differ from theirs.
        x = x.to(torch.get_autocast_dtype(device_type))
    dim = _gather_dim(x, mesh, dim)
    out, codes, scales = _MXAllGather.apply(x, mesh, dim, cast)
    # The consumers' gradients are partial sums (a columnwise linear's dX): they pass
    # through as they are, and the gather's backward reduce-scatters them.
    decoded = DTensor.from_local(
        out, mesh, (Replicate(),), run_check=False, grad_placements=(Partial(),)
    )
    if _HOOKS and not torch.compiler.is_compiling():
        gathered = GatheredCast(decoded, codes, scales, cast)
        for hook in tuple(_HOOKS.values()):
            hook(gathered)
    return decoded
