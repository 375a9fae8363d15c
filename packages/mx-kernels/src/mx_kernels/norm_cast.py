"""RMSNorm fused with the MX cast of its output, as ``torch.library`` ops.

===========================  ==================================================
op                           returns
===========================  ==================================================
``mx::rms_norm_quantize``    y, rstd, and the rowwise cast of y (qdata, scale)
``mx::rms_norm_quantize_``   y, rstd, and both casts of y (``quantize_both``'s
``both``                     outputs, scales as their contiguous buffers)
``mx::rms_norm_backward``    dx, dweight
===========================  ==================================================

The definition is Hugging Face's ``LlamaRMSNorm`` with the output in x's dtype
(:func:`rms_norm_reference`, plain torch): in fp32, ``rstd = rsqrt(mean(x^2) + eps)``,
``y = weight * (x * rstd).to(x.dtype)``, then ``.to(x.dtype)``. The casts are those of
the rounded y: equal to ``quantize_rowwise(y)`` / ``quantize_both(y)`` bit for bit. One
read of x writes y, rstd and the codes, where the unfused path reads y again to cast it.

Exactness of the Triton kernel against the reference: rstd depends on the order in which
the squares are summed (fp32), so it can differ from torch's in the last bits; every
other step is rounded as torch rounds it (the division and square root IEEE-rounded, as
torch's CPU ``rsqrt``; CUDA's ``rsqrtf`` can differ from both by an ulp). Given the same
rstd, y is the reference's bit for bit; with it, y can differ by one unit in the last
place of x's dtype where a product lands next to a rounding boundary.

:func:`rms_norm_quantize` is differentiable in x and weight (through y; rstd and the
casts are not): the backward is ``mx::rms_norm_backward``, in fp32 (Triton, or torch ops
for the reference backend).
"""

from __future__ import annotations

import math

import torch

import mx_core
from mx_core import get_format
from mx_kernels.backend import TRITON_BLOCK_SIZES, resolve_backend_for
from mx_kernels.cast import quantize_both, quantize_rowwise
from mx_kernels.cast_launch import empty_both, empty_cast
from mx_kernels.cast_plan import check_args, public_layout
from mx_kernels.library import define_op, may_skip_dispatch

__all__ = ["NORM_WEIGHT_DTYPES", "rms_norm_backward", "rms_norm_quantize", "rms_norm_reference"]

NORM_WEIGHT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
"""Dtypes of the norm's weight (x's are :data:`mx_core.INPUT_DTYPES`)."""


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm as the ops define it: Hugging Face's ``LlamaRMSNorm``, output in x's dtype.

    Args:
        x: [..., K]; weight: [K]; eps: added to the mean square.
    Returns:
        ``(y [..., K] in x's dtype, rstd [...] fp32)``.
    """
    x32 = x.to(torch.float32)
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    y = (weight * (x32 * rstd).to(x.dtype)).to(x.dtype)
    return y, rstd.squeeze(-1)


def _backward_reference(dy, x, weight, rstd):
    """The gradients of :func:`rms_norm_reference`'s y, in fp32 torch ops (the rounding
    of ``x * rstd`` to x's dtype passed through, as autograd does)."""
    k = x.shape[-1]
    r = rstd.unsqueeze(-1)
    n = x.to(torch.float32) * r
    dy32 = dy.to(torch.float32)
    g = dy32 * weight.to(torch.float32)
    dx = (g - n * (g * n).mean(-1, keepdim=True)) * r
    dw = (dy32 * n.to(x.dtype).to(torch.float32)).reshape(-1, k).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def _check_tensors(fn: str, x, weight, block_size: int, colwise: bool) -> None:
    mx_core.check_quantize_args(x, block_size, -1, fn=fn)
    k = x.shape[-1]
    if k == 0:
        raise ValueError(f"{fn}: x has shape {tuple(x.shape)}; its last dim must not be empty")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{fn}: weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype not in NORM_WEIGHT_DTYPES:
        allowed = ", ".join(str(d) for d in NORM_WEIGHT_DTYPES)
        raise TypeError(f"{fn}: weight has dtype {weight.dtype}; allowed: {allowed}")
    if tuple(weight.shape) != (k,):
        raise ValueError(
            f"{fn}: weight has shape {tuple(weight.shape)}; x of shape {tuple(x.shape)} "
            f"needs ({k},)"
        )
    if weight.device != x.device:
        raise ValueError(f"{fn}: weight is on {weight.device} but x is on {x.device}")
    m = math.prod(x.shape[:-1])
    if colwise and not torch.compiler.is_compiling() and m % block_size:
        raise ValueError(
            f"{fn}: colwise=True casts the [M, K] fold of x (shape {tuple(x.shape)}) along "
            f"M={m}, which is not divisible by block_size={block_size}"
        )


def _check_eps(fn: str, eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{fn}: eps must be a float, got {type(eps).__name__} {eps!r}")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{fn}: eps={eps} must be finite and >= 0")


def _gap(block_size: int) -> str | None:
    if block_size in TRITON_BLOCK_SIZES:
        return None
    return f"block_size={block_size} has no Triton kernel (Triton: {TRITON_BLOCK_SIZES})"


def _forward_impl(op: str, colwise: bool):
    def impl(x, weight, eps: float, fmt: str, block_size: int, scale_mode: str, backend: str):
        _check_tensors(op, x, weight, block_size, colwise)
        k = x.shape[-1]
        if resolve_backend_for(op, backend, x.device, _gap(block_size)) == "reference":
            y, rstd = rms_norm_reference(x, weight, eps)
            y, rstd = y.contiguous(), rstd.contiguous()  # x may be strided
            cast = dict(block_size=block_size, scale_mode=scale_mode, backend="reference")
            if colwise:  # the op returns both scales as their contiguous buffers
                q, s, qt, st = quantize_both(y.reshape(-1, k), fmt, **cast)
                return y, rstd, q, s.t(), qt, st.t()
            return (y, rstd, *quantize_rowwise(y, fmt, **cast))
        from mx_kernels.norm_cast_triton import rms_norm_cast_triton  # imports triton

        f = get_format(fmt)
        x2d = x.reshape(-1, k)
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        args = (x2d, weight.contiguous(), eps, f, block_size, scale_mode, y.view(-1, k))
        if colwise:
            q, s_buf, qt, st_buf = empty_both(x2d.shape, f, block_size, x.device)
            rms_norm_cast_triton(*args, rstd.view(-1), q, s_buf.t(), qt, st_buf)
            return y, rstd, q, s_buf, qt, st_buf
        q, s = empty_cast(x.shape, f, block_size, x.device)
        q2d, s2d = q.view(-1, q.shape[-1]), s.view(-1, s.shape[-1])
        rms_norm_cast_triton(*args, rstd.view(-1), q2d, s2d)
        return y, rstd, q, s

    return impl


def _forward_fake(colwise: bool):
    def fake(x, weight, eps, fmt, block_size, scale_mode, backend):
        f, k = get_format(fmt), x.shape[-1]
        y = x.new_empty(x.shape)
        rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)
        if colwise:
            return y, rstd, *empty_both((x.numel() // k, k), f, block_size, x.device)
        return y, rstd, *empty_cast(x.shape, f, block_size, x.device)

    return fake


_ARGS = (
    "(Tensor x, Tensor weight, float eps, str fmt, SymInt block_size, str scale_mode, str backend)"
)
_IMPLS = {
    False: _forward_impl("rms_norm_quantize", False),
    True: _forward_impl("rms_norm_quantize_both", True),
}
RMS_NORM_QUANTIZE = define_op(
    f"rms_norm_quantize{_ARGS} -> (Tensor, Tensor, Tensor, Tensor)",
    _IMPLS[False],
    _forward_fake(False),
)
RMS_NORM_QUANTIZE_BOTH = define_op(
    f"rms_norm_quantize_both{_ARGS} -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    _IMPLS[True],
    _forward_fake(True),
)


def _backward_impl(dy, x, weight, rstd, backend: str):
    fn = "rms_norm_backward"
    _check_tensors(fn, x, weight, 2, False)
    for name, t, shape in (("dy", dy, x.shape), ("rstd", rstd, x.shape[:-1])):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != shape or not t.is_floating_point() or t.device != x.device:
            raise ValueError(
                f"{fn}: {name} has shape {tuple(t.shape)}, dtype {t.dtype} on {t.device}; "
                f"needs a float tensor of shape {tuple(shape)} on {x.device}"
            )
    if rstd.dtype != torch.float32:
        raise ValueError(f"{fn}: rstd has dtype {rstd.dtype}; expected torch.float32")
    if resolve_backend_for(fn, backend, x.device, None) == "reference":
        return _backward_reference(dy, x, weight, rstd)
    from mx_kernels.norm_cast_triton import rms_norm_backward_triton  # imports triton

    k = x.shape[-1]
    dx, dw = rms_norm_backward_triton(
        dy.reshape(-1, k), x.reshape(-1, k), weight.contiguous(), rstd.reshape(-1).contiguous()
    )
    return dx.view(x.shape), dw


RMS_NORM_BACKWARD = define_op(
    "rms_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd, str backend) "
    "-> (Tensor, Tensor)",
    _backward_impl,
    lambda dy, x, weight, rstd, backend: (x.new_empty(x.shape), weight.new_empty(weight.shape)),
)


class _RMSNormQuantize(torch.autograd.Function):
    """y differentiable in x and weight; rstd and the casts are not."""

    @staticmethod
    def forward(ctx, x, weight, eps, fmt, block_size, scale_mode, backend, colwise):
        op = RMS_NORM_QUANTIZE_BOTH if colwise else RMS_NORM_QUANTIZE
        outs = op(x, weight, eps, fmt, block_size, scale_mode, backend)
        ctx.save_for_backward(x, weight, outs[1])
        ctx.backend = backend
        ctx.mark_non_differentiable(*outs[1:])
        return outs

    @staticmethod
    def backward(ctx, dy, *_):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = RMS_NORM_BACKWARD(dy, x, weight, rstd, ctx.backend)
        return dx, dw, None, None, None, None, None, None


def rms_norm_quantize(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
    colwise: bool = False,
) -> tuple[torch.Tensor, ...]:
    """RMSNorm of x (:func:`rms_norm_reference`) and the MX cast of the result, from
    one read of x.

    Args:
        x: [..., K] fp32/bf16/fp16, K > 0 divisible by ``block_size``; any strides.
        weight: [K] fp32/bf16/fp16, on x's device.
        eps: added to the mean square (finite, >= 0), as an fp32 number.
        fmt, block_size, scale_mode: as :func:`mx_core.quantize`.
        backend: ``"auto"``, ``"triton"`` or ``"reference"`` (see :mod:`mx_kernels.backend`).
        colwise: also the columnwise cast, of y's [M, K] fold (M divisible by block_size).
    Returns:
        ``(y, rstd, qdata, scale)``: y [..., K] in x's dtype (contiguous), rstd [...] fp32,
        and ``quantize_rowwise(y, fmt, ...)``'s qdata [..., K] (fp4: [..., K // 2]) and
        scale [..., K // block_size]. With colwise: ``(y, rstd, q_row, s_row, q_col_t,
        s_col_t)``, the last four ``quantize_both(y.reshape(-1, K), fmt, ...)``'s, in
        its layouts. y carries the gradient to x and weight (:func:`rms_norm_backward`).
    Raises:
        TypeError: x, weight or eps of the wrong type or dtype; block_size not an int.
        ValueError: shapes, devices, eps, fmt, scale_mode or backend not as above (the
            message names the argument and what is allowed).
    """
    fn = "rms_norm_quantize"
    if not isinstance(colwise, bool):
        raise TypeError(f"{fn}: colwise must be a bool, got {colwise!r}")
    name, mode = check_args(fn, x, fmt, block_size, scale_mode, backend)
    _check_eps(fn, eps)
    _check_tensors(fn, x, weight, block_size, colwise)
    args = (x, weight, float(eps), name, block_size, mode, backend)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        outs = _RMSNormQuantize.apply(*args, colwise)
    elif may_skip_dispatch(x) and may_skip_dispatch(weight) and type(block_size) is int:
        outs = _IMPLS[colwise](*args)
    else:
        outs = (RMS_NORM_QUANTIZE_BOTH if colwise else RMS_NORM_QUANTIZE)(*args)
    return (*outs[:2], *public_layout(outs[2:])) if colwise else tuple(outs)


def rms_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`rms_norm_reference`'s y = RMSNorm(x) * weight, in fp32.

    Args:
        dy: [..., K], the gradient of y (any float dtype); x: [..., K], the forward's input;
        weight: [K]; rstd: [...] fp32, the forward's.
        backend: ``"auto"``, ``"triton"`` or ``"reference"`` (torch ops).
    Returns:
        ``(dx [..., K] in x's dtype, dweight [K] in weight's dtype)``: within fp32
        rounding of the reference's autograd (sums in another order, and no rounding of
        ``dy * weight`` or ``dy * n`` to x's dtype before they are summed).
    Raises:
        TypeError, ValueError: as :func:`rms_norm_quantize`, and dy or rstd not of the
            shapes above.
    """
    return tuple(RMS_NORM_BACKWARD(dy, x, weight, rstd, backend))
