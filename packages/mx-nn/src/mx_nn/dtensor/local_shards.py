"""An MXLinear's DTensor input and weight run as one autograd op on their local shards.

The layer's ops are the same either way (each mx op's sharding rule keeps its inputs'
placements and communicates nothing, :mod:`mx_dtensor`), so instead of dispatching each
of them through DTensor, the layer computes on the local tensors and wraps the result
in the placements :func:`mx_nn.dtensor.placements.linear_layout` gives: the same values bit for
bit and the same gradient placements (``tests/test_local_shards.py``), without DTensor's
per-op host cost (BENCHMARKS.md, 2026-12-04 'DTensor path: local shards').

Eager, :class:`_OnLocalShards` takes the DTensors in and gives a DTensor out, building
the output and gradient DTensors from specs made once per layout:
``to_local`` / ``from_local`` cost more host time than DTensor's dispatch of a cheap op. Under
torch.compile the same is written with ``to_local`` / ``from_local``, which the compiler
traces (and then costs nothing at run time).

:func:`dispatch_per_op` switches it off: every mx op of the layer then goes through
DTensor's dispatch and the sharding rules, the reference the tests and
``tools/bench/dtensor_overhead.py`` compare against.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

from mx_nn.dtensor.placements import LinearLayout

__all__ = [
    "check_local_shard",
    "dispatch_per_op",
    "local_shards_enabled",
    "on_local_shards",
    "reduced",
]

# torch 2.13's from_local takes the gradient's placements; 2.11's has no such argument
# and hands a Partial gradient of a Partial output back unreduced.
_FROM_LOCAL_GRAD = "grad_placements" in inspect.signature(DTensor.from_local).parameters
_SPECS: dict[tuple, tuple[DTensorSpec, ...]] = {}
# Eager runs :class:`_OnLocalShards`; False runs the traceable form eagerly too (tests).
_EAGER_OP = True
_ENABLED = True  # False inside dispatch_per_op()


def local_shards_enabled() -> bool:
    """Whether MXLinear runs DTensor inputs and weights as one op on their local shards
    (True, the default) or dispatches each mx op through DTensor (False: inside
    :func:`dispatch_per_op`).

    Returns:
        The process-wide setting, read by every MXLinear call on DTensors.
    """
    return _ENABLED


@contextlib.contextmanager
def dispatch_per_op() -> Iterator[None]:
    """Inside, MXLinear dispatches every mx op of a call on DTensors through DTensor and
    the sharding rules of :mod:`mx_dtensor` instead of running as one op on the local
    shards: the same results bit for bit and the same gradient placements, at more host
    time per call. For comparing the two (tests, ``tools/bench/dtensor_overhead.py``).

    Process-wide (every layer, every thread); nests, and restores the setting it found
    on exit, also on an exception.
    """
    global _ENABLED
    before, _ENABLED = _ENABLED, False
    try:
        yield
    finally:
        _ENABLED = before


def reduced(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` with Partial placements reduced: the casts need the summed values.

    Where every mx op is dispatched through DTensor, the gradient of a Partial output (a
    rowwise layer) reaches MXLinear's backward Replicate from PyTorch's styles, so this
    is a no-op in eager. Where torch.compile traces an autograd.Function, it first
    assumes a gradient with the output's placements (Partial); AOTAutograd then traces
    the real backward with the tangent coerced to Replicate
    (``DTensor.__coerce_tangent_metadata__``), where this is again a no-op.

    Args:
        grad: the output's gradient, a tensor or a DTensor.

    Returns:
        ``grad`` itself, or a DTensor with each Partial placement made Replicate.
    """
    if isinstance(grad, DTensor) and any(p.is_partial() for p in grad.placements):
        return grad.redistribute(grad.device_mesh, _summed(grad.placements))
    return grad


def _contiguous(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _summed(placements) -> tuple:
    return tuple(Replicate() if p.is_partial() else p for p in placements)


def on_local_shards(
    fn,
    x: DTensor,
    weight: DTensor,
    config,
    layout: LinearLayout,
    dtype: torch.dtype | None,
    weight_grad: bool,
) -> DTensor:
    """``fn.apply(x_local, weight_local, config, weight_grad)`` (an MXLinear autograd
    function) as one op from DTensors to a DTensor placed as ``layout`` says.

    Args:
        fn: ``MXLinearFunction`` or ``FakeQuantLinearFunction`` of :mod:`mx_nn.linear_gemms`.
        x: the input DTensor [..., K].
        weight: the weight DTensor [N, K].
        config: the layer's config.
        layout: the placements of this call (:func:`mx_nn.dtensor.placements.linear_layout`).
        dtype: the autocast dtype both operands are cast to first (as F.linear would),
            or None.
        weight_grad: whether backward computes dW.

    Returns:
        Y [..., N], a DTensor placed as ``layout.output``.
    """
    if not _EAGER_OP or torch.compiler.is_compiling():
        shape = (*x.shape[:-1], weight.shape[0])
        return _traceable(fn, x, weight, config, layout, dtype, shape, weight_grad)
    out_dtype = dtype or x.dtype
    key = (layout, x.device_mesh, x.shape, weight.shape, x.dtype, weight.dtype, out_dtype)
    specs = _SPECS.get(key)
    if specs is None:
        if len(_SPECS) >= 4096:
            _SPECS.clear()
        specs = _SPECS[key] = _specs(x, weight, layout, out_dtype)
    return _OnLocalShards.apply(x, weight, fn, config, dtype, specs, weight_grad)


class _Specs(NamedTuple):
    """The specs of the output and the gradients, shared by every tensor made from them."""

    output: DTensorSpec
    grad_input: DTensorSpec
    grad_weight: DTensorSpec
    grad_output: tuple  # the placements backward takes the output's gradient in


def _specs(x: DTensor, weight: DTensor, layout: LinearLayout, out_dtype) -> _Specs:
    mesh, shape = x.device_mesh, torch.Size((*x.shape[:-1], weight.shape[0]))
    return _Specs(
        DTensorSpec(mesh, layout.output, TensorMeta(shape, _contiguous(shape), out_dtype)),
        DTensorSpec(mesh, layout.grad_input, TensorMeta(x.shape, _contiguous(x.shape),
                                                        x.dtype)),
        DTensorSpec(mesh, layout.grad_weight, TensorMeta(weight.shape,
                                                         _contiguous(weight.shape),
                                                         weight.dtype)),
        _summed(layout.output),
    )  # fmt: skip


class _OnLocalShards(torch.autograd.Function):
    """DTensors in, DTensor out; ``fn``'s forward and backward run on the local tensors
    with this op's context (its ``needs_input_grad`` are x's and weight's too)."""

    @staticmethod
    def forward(ctx, x, weight, fn, config, dtype, specs, weight_grad):
        x_local, w_local = x._local_tensor, weight._local_tensor
        if dtype is not None:
            x_local, w_local = x_local.to(dtype), w_local.to(dtype)
        ctx.fn, ctx.specs, ctx.dtypes = fn, specs, (x.dtype, weight.dtype)
        device = x_local.device.type
        if torch.is_autocast_enabled(device):
            with torch.autocast(device, enabled=False):
                y = fn.forward(ctx, x_local, w_local, config, weight_grad)
        else:  # entering autocast(enabled=False) would change nothing, at a few us
            y = fn.forward(ctx, x_local, w_local, config, weight_grad)
        return _dtensor(y, specs.output)

    @staticmethod
    def backward(ctx, grad):
        specs = ctx.specs
        if tuple(grad.placements) != specs.grad_output:
            grad = grad.redistribute(grad.device_mesh, specs.grad_output)
        local, device = grad._local_tensor, grad.device.type
        if torch.is_autocast_enabled(device):
            with torch.autocast(device, enabled=False):
                grad_x, grad_w, *_ = ctx.fn.backward(ctx, local)
        else:
            grad_x, grad_w, *_ = ctx.fn.backward(ctx, local)
        x_dtype, w_dtype = ctx.dtypes
        if grad_x is not None:
            grad_x = _dtensor(grad_x.to(x_dtype).contiguous(), specs.grad_input)
        if grad_w is not None:
            grad_w = _dtensor(grad_w.to(w_dtype).contiguous(), specs.grad_weight)
        return grad_x, grad_w, None, None, None, None, None


# DTensor's constructor as its __new__ alone: DTensor.__init__ only marks the constructor
# for torch.export, through wrappers that cost more host time than making the tensor.
# Where __new__ is not this C++ constructor (older torch), DTensor(...) is called.
_NEW = getattr(torch.Tensor, "_dtensor__new__", None)
_FAST_NEW = _NEW is not None and DTensor.__new__ is _NEW


def _dtensor(local: torch.Tensor, spec: DTensorSpec) -> DTensor:
    """``DTensor(local, spec, requires_grad=False)``. The spec is shared by every tensor
    made from one layout, as DTensor's dispatch shares an op's cached output spec between
    its results: DTensor's sharding cache then finds it by identity, not by comparing."""
    if _FAST_NEW and not torch.compiler.is_exporting():
        return _NEW(DTensor, local, spec, requires_grad=False)
    return DTensor(local, spec, requires_grad=False)


def _traceable(fn, x, weight, config, layout: LinearLayout, dtype, shape, weight_grad) -> DTensor:
    """The same with ``to_local`` / ``from_local``, for torch.compile to trace."""
    mesh = x.device_mesh
    x = x.to_local(grad_placements=layout.grad_input)
    weight = weight.to_local(grad_placements=layout.grad_weight)
    if dtype is not None:
        x, weight = x.to(dtype), weight.to(dtype)
    with torch.autocast(x.device.type, enabled=False):
        y = fn.apply(x, weight, config, weight_grad)
    kwargs = {"run_check": False, "shape": torch.Size(shape), "stride": _contiguous(shape)}
    if _FROM_LOCAL_GRAD:
        grad = _summed(layout.output)
        return DTensor.from_local(y, mesh, layout.output, grad_placements=grad, **kwargs)
    return _ReduceGrad.apply(DTensor.from_local(y, mesh, layout.output, **kwargs))


class _ReduceGrad(torch.autograd.Function):
    """Identity forward; backward reduces a Partial gradient (:func:`reduced`)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return reduced(grad)


def check_local_shard(layer_name: str, block_size: int, weight: torch.Tensor) -> None:
    """Check a weight that is a plain tensor of other than the layer's full shape: the
    local shard a framework hands each linear (torchtitan 0.3's spmd_types backend)
    must keep whole MX blocks along both dims.

    Args:
        layer_name: how errors name the layer (``MXLinear.layer_name``).
        block_size: the layer's MX block size.
        weight: the layer's weight as its forward sees it.

    Raises:
        ValueError: a DTensor, not 2-D, or a dim not a multiple of ``block_size``.
    """
    if (
        isinstance(weight, DTensor)
        or weight.dim() != 2
        or any(d % block_size for d in weight.shape)
    ):
        raise ValueError(
            f"{layer_name}: weight of shape {tuple(weight.shape)} is neither the full "
            f"weight nor a local shard of whole {block_size}-element MX blocks"
        )
