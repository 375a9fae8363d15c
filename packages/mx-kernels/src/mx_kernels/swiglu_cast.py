"""SwiGLU fused with the MX cast of its output, as ``torch.library`` ops.

=============================  ===================================================
op                             returns
=============================  ===================================================
``mx::swiglu_quantize``        h, and the rowwise cast of h (qdata, scale)
``mx::swiglu_quantize_both``   h, and both casts of h (``quantize_both``'s
                               outputs, scales as their contiguous buffers)
=============================  ===================================================

``h = F.silu(gate) * up`` in the inputs' dtype, as torch computes it (:func:`swiglu_reference`):
silu in fp32, rounded once to the dtype, then the product, rounded once. The casts are
those of the rounded h: equal to ``quantize_rowwise(h)`` / ``quantize_both(h)`` bit for
bit. One read of gate and up writes h and its codes, where the unfused path reads h
again to cast it. The kernel follows torch's rounding steps exactly; only exp's last bit
is the math library's (see :mod:`mx_kernels.swiglu_cast_triton`).

:func:`swiglu_quantize` is differentiable in gate and up (through h): the backward is
:func:`swiglu_backward`, torch's own ops for the reference's autograd (elementwise,
so the same values as ``torch.autograd`` of :func:`swiglu_reference`, bit for bit).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import mx_core
from mx_core import get_format
from mx_kernels.backend import TRITON_BLOCK_SIZES, resolve_backend_for
from mx_kernels.cast import quantize_both, quantize_rowwise
from mx_kernels.cast_launch import empty_both, empty_cast
from mx_kernels.cast_plan import check_args, public_layout
from mx_kernels.library import define_op, may_skip_dispatch

__all__ = ["swiglu_backward", "swiglu_quantize", "swiglu_reference"]


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's product, as torch computes it.

    Args:
        gate, up: [..., K], one shape and dtype.
    Returns:
        ``F.silu(gate) * up``: [..., K] in the inputs' dtype.
    """
    return F.silu(gate) * up


def swiglu_backward(
    dh: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`swiglu_reference` by the ops torch's autograd runs for it
    (silu recomputed from gate: nothing but gate and up is kept from the forward).

    Args:
        dh, gate, up: [..., K], one shape.
    Returns:
        ``(d_gate, d_up)``, bit-identical to ``torch.autograd.grad`` of
        ``F.silu(gate) * up``.
    """
    d_up = dh * F.silu(gate)
    d_gate = torch.ops.aten.silu_backward(dh * up, gate)
    return d_gate, d_up


def _check_tensors(fn: str, gate, up, block_size: int, colwise: bool) -> None:
    mx_core.check_quantize_args(gate, block_size, -1, fn=fn)
    if not isinstance(up, torch.Tensor):
        raise TypeError(f"{fn}: up must be a torch.Tensor, got {type(up).__name__}")
    if up.shape != gate.shape or up.dtype != gate.dtype or up.device != gate.device:
        raise ValueError(
            f"{fn}: up ({tuple(up.shape)}, {up.dtype}, {up.device}) must match gate "
            f"({tuple(gate.shape)}, {gate.dtype}, {gate.device}) in shape, dtype and device"
        )
    m = math.prod(gate.shape[:-1])
    if colwise and not torch.compiler.is_compiling() and m % block_size:
        raise ValueError(
            f"{fn}: colwise=True casts the [M, K] fold of h (shape {tuple(gate.shape)}) "
            f"along M={m}, which is not divisible by block_size={block_size}"
        )


def _gap(block_size: int) -> str | None:
    if block_size in TRITON_BLOCK_SIZES:
        return None
    return f"block_size={block_size} has no Triton kernel (Triton: {TRITON_BLOCK_SIZES})"


def _forward_impl(op: str, colwise: bool):
    def impl(gate, up, fmt: str, block_size: int, scale_mode: str, backend: str):
        _check_tensors(op, gate, up, block_size, colwise)
        k = gate.shape[-1]
        if resolve_backend_for(op, backend, gate.device, _gap(block_size)) == "reference":
            h = swiglu_reference(gate, up).contiguous()
            cast = dict(block_size=block_size, scale_mode=scale_mode, backend="reference")
            if colwise:  # the op returns both scales as their contiguous buffers
                q, s, qt, st = quantize_both(h.reshape(-1, k), fmt, **cast)
                return h, q, s.t(), qt, st.t()
            return (h, *quantize_rowwise(h, fmt, **cast))
        from mx_kernels.swiglu_cast_triton import swiglu_cast_triton  # imports triton

        f = get_format(fmt)
        gate2d, up2d = gate.reshape(-1, k), up.reshape(-1, k)
        h = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        args = (gate2d, up2d, f, block_size, scale_mode, h.view(-1, k))
        if colwise:
            q, s_buf, qt, st_buf = empty_both(gate2d.shape, f, block_size, gate.device)
            swiglu_cast_triton(*args, q, s_buf.t(), qt, st_buf)
            return h, q, s_buf, qt, st_buf
        q, s = empty_cast(gate.shape, f, block_size, gate.device)
        swiglu_cast_triton(*args, q.view(-1, q.shape[-1]), s.view(-1, s.shape[-1]))
        return h, q, s

    return impl


def _forward_fake(colwise: bool):
    def fake(gate, up, fmt, block_size, scale_mode, backend):
        f, k = get_format(fmt), gate.shape[-1]
        h = gate.new_empty(gate.shape)
        if colwise:
            return h, *empty_both((gate.numel() // k, k), f, block_size, gate.device)
        return h, *empty_cast(gate.shape, f, block_size, gate.device)

    return fake


_ARGS = "(Tensor gate, Tensor up, str fmt, SymInt block_size, str scale_mode, str backend)"
_IMPLS = {
    False: _forward_impl("swiglu_quantize", False),
    True: _forward_impl("swiglu_quantize_both", True),
}
SWIGLU_QUANTIZE = define_op(
    f"swiglu_quantize{_ARGS} -> (Tensor, Tensor, Tensor)", _IMPLS[False], _forward_fake(False)
)
SWIGLU_QUANTIZE_BOTH = define_op(
    f"swiglu_quantize_both{_ARGS} -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _IMPLS[True],
    _forward_fake(True),
)


class _SwiGLUQuantize(torch.autograd.Function):
    """h differentiable in gate and up; the casts are not."""

    @staticmethod
    def forward(ctx, gate, up, fmt, block_size, scale_mode, backend, colwise):
        op = SWIGLU_QUANTIZE_BOTH if colwise else SWIGLU_QUANTIZE
        outs = op(gate, up, fmt, block_size, scale_mode, backend)
        ctx.save_for_backward(gate, up)
        ctx.mark_non_differentiable(*outs[1:])
        return outs

    @staticmethod
    def backward(ctx, dh, *_):
        gate, up = ctx.saved_tensors
        return (*swiglu_backward(dh, gate, up), None, None, None, None, None)


def swiglu_quantize(
    gate: torch.Tensor,
    up: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
    colwise: bool = False,
) -> tuple[torch.Tensor, ...]:
    """SwiGLU (:func:`swiglu_reference`) and the MX cast of the result, from one read of
    gate and up.

    Args:
        gate, up: [..., K] of one dtype (fp32/bf16/fp16), device and shape, K divisible
            by ``block_size``; any strides.
        fmt, block_size, scale_mode: as :func:`mx_core.quantize`.
        backend: ``"auto"``, ``"triton"`` or ``"reference"`` (see :mod:`mx_kernels.backend`).
        colwise: also the columnwise cast, of h's [M, K] fold (M divisible by block_size).
    Returns:
        ``(h, qdata, scale)``: h [..., K] in the inputs' dtype (contiguous), and
        ``quantize_rowwise(h, fmt, ...)``'s qdata [..., K] (fp4: [..., K // 2]) and scale
        [..., K // block_size]. With colwise: ``(h, q_row, s_row, q_col_t, s_col_t)``,
        the last four ``quantize_both(h.reshape(-1, K), fmt, ...)``'s, in its layouts.
        h carries the gradient to gate and up (:func:`swiglu_backward`).
    Raises:
        TypeError: gate or up not a tensor of an allowed dtype; block_size not an int.
        ValueError: shapes, dtypes or devices differ; fmt, scale_mode, backend or the
            divisibility not as above (the message names the argument).
    """
    fn = "swiglu_quantize"
    if not isinstance(colwise, bool):
        raise TypeError(f"{fn}: colwise must be a bool, got {colwise!r}")
    name, mode = check_args(fn, gate, fmt, block_size, scale_mode, backend)
    _check_tensors(fn, gate, up, block_size, colwise)
    args = (gate, up, name, block_size, mode, backend)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        outs = _SwiGLUQuantize.apply(*args, colwise)
    elif may_skip_dispatch(gate) and may_skip_dispatch(up) and type(block_size) is int:
        outs = _IMPLS[colwise](*args)
    else:
        outs = (SWIGLU_QUANTIZE_BOTH if colwise else SWIGLU_QUANTIZE)(*args)
    return (outs[0], *public_layout(outs[1:])) if colwise else tuple(outs)
