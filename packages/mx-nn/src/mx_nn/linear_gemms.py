"""MXLinear's two autograd functions, each its three GEMMs with their casts (the
:mod:`mx_nn.linear` module doc describes both): the MX path through ``scaled_mm`` and the
fused path (fake-quantized casts + bf16 GEMMs).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch
from torch.distributed.tensor import DTensor

import mx_kernels
import mx_nn.fsdp.gathered as fsdp_gathered
from mx_core import MXTensor, get_format
from mx_kernels.matmul import bf16_gemm
from mx_nn.casts.compute_path import GEMM_BLOCK, blocked_scales
from mx_nn.casts.fused import fused_casts
from mx_nn.casts.layer import (
    as_rows,
    cast_weight,
    colwise_values,
    config_cast,
    fake_quantized_input,
    mx_input,
    pad_rows,
)
from mx_nn.casts.scopes import weight_casts_kept
from mx_nn.config import MXLinearConfig
from mx_nn.dtensor.local_shards import reduced

__all__ = ["FakeQuantLinearFunction", "MXLinearFunction", "route_bf16_gemms"]

logger = logging.getLogger("mx_nn")
_LOGGED: set[tuple[str, str]] = set()  # (why, device) of the emulated GEMMs logged
_bf16_gemm = bf16_gemm  # the fused path's GEMM: route_bf16_gemms() replaces it


def _gemm(a, a_fmt: str, b, b_fmt: str, out_dtype: torch.dtype, c: MXLinearConfig):
    """``a @ b^T`` of two rowwise casts ``(qdata, scale)``, K-major both; a flat scale is
    in cuBLAS's blocked layout (:func:`mx_nn.casts.compute_path.blocked_scales`)."""
    fp6 = [f for f in (a_fmt, b_fmt) if get_format(f).bits == 6]
    if not fp6 and c.block_size == GEMM_BLOCK:
        layout = tuple("blocked" if s.dim() == 1 else "plain" for s in (a[1], b[1]))
        return mx_kernels.scaled_mm(
            *a, *b, out_dtype=out_dtype, backend=c.gemm_backend, scale_layout=layout
        )
    why = f"{fp6[0]} has no MX GEMM" if fp6 else f"block_size={c.block_size} != 32"
    if (why, str(a[0].device)) not in _LOGGED:
        _LOGGED.add((why, str(a[0].device)))
        logger.info("mx_nn.MXLinear: fp32 emulated GEMM on %s (%s)", a[0].device.type, why)
    a_hp = MXTensor(a[0], a[1], a_fmt, c.block_size, 1, torch.float32).dequantize()
    b_hp = MXTensor(b[0], b[1], b_fmt, c.block_size, 1, torch.float32).dequantize()
    return (a_hp @ b_hp.t()).to(out_dtype)


class MXLinearFunction(torch.autograd.Function):
    """The MX path: MX casts and ``scaled_mm`` for Y, dX and dW (or dW in high
    precision); ``apply(x [..., K], weight [N, K], config, weight_grad)`` -> [..., N]."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, c: MXLinearConfig, weight_grad: bool
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        # Blocked scales where the forward GEMM runs on cuBLAS; never for DTensors (each
        # rank's rows would pad to 128 on their own; mx-dtensor takes them replicated only)
        plain = not isinstance(x, DTensor) and not isinstance(weight, DTensor)
        blocked = plain and blocked_scales(x.device, c, x.dtype)
        ctx.scale_layout = layout = "blocked" if blocked else "plain"
        (x_q, x_s), saved_x = mx_input(x2, c, c.needs_colwise_input and weight_grad, layout)
        ctx.gathered_weight = fsdp_gathered.is_gathered(weight)  # FSDP gathered it in MX
        if ctx.gathered_weight:  # its rowwise cast; backward's gather brings the colwise one
            (w_q, w_s), saved_w = fsdp_gathered.rowwise(weight, c), (weight,)
        else:
            fn = mx_kernels.quantize_both  # kept with its layout under keep_weight_casts()
            w_q, w_s, *saved_w = cast_weight(fn, weight, c.weight_fmt, c, scale_layout=layout)
        y = _gemm((x_q, x_s), c.input_fmt, (w_q, w_s), c.weight_fmt, x.dtype, c)
        ctx.save_for_backward(*saved_w, *saved_x)
        # No shapes on ctx (SymInts there trip torch 2.11's dynamo, as in check_scaled_mm_args).
        ctx.config, ctx.x_dtype, ctx.w_dtype = c, x.dtype, weight.dtype
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        c: MXLinearConfig = ctx.config
        layout: str = ctx.scale_layout
        saved = ctx.saved_tensors
        if ctx.gathered_weight:
            saved = (*fsdp_gathered.colwise(saved[0], c), *saved[1:])
        wt_q, wt_s, *saved_x = saved
        dy = reduced(grad_output).reshape(-1, grad_output.shape[-1])
        m = dy.shape[0]
        grad_x = grad_w = None
        if c.hp_weight_grad:
            if ctx.needs_input_grad[1]:
                (x2,) = saved_x
                grad_w = (dy.t() @ x2.to(dy.dtype)).to(ctx.w_dtype)
            dy_q, dy_s = config_cast(
                mx_kernels.quantize_rowwise, dy, c.grad_output_fmt, c, scale_layout=layout
            )
        else:
            dy_q, dy_s, dyt_q, dyt_s = config_cast(
                mx_kernels.quantize_both, pad_rows(dy, c.block_size), c.grad_output_fmt, c,
                scale_layout=layout,
            )  # fmt: skip
            # flat blocked scales of the padded rows pad to the same 128-row multiple
            dy_q, dy_s = dy_q[:m], (dy_s if dy_s.dim() == 1 else dy_s[:m])
            if ctx.needs_input_grad[1]:
                xt_q, xt_s = saved_x  # X's columnwise cast, made in forward
                grad_w = _gemm(
                    (dyt_q, dyt_s), c.grad_output_fmt, (xt_q, xt_s), c.input_fmt, ctx.w_dtype, c
                )
        if ctx.needs_input_grad[0]:
            grad_x = _gemm(
                (dy_q, dy_s), c.grad_output_fmt, (wt_q, wt_s), c.weight_fmt, ctx.x_dtype, c
            ).reshape(*grad_output.shape[:-1], wt_q.shape[0])
        return grad_x, grad_w, None, None


class FakeQuantLinearFunction(torch.autograd.Function):
    """The same three GEMMs where ``scaled_mm`` would dequantize to bf16 anyway (sm90):
    each cast writes the dequantized values (``mx_kernels.fake_quantize_*``, one pass),
    then bf16 GEMMs take them in either orientation. Same values and accumulation as
    the MX path through ``scaled_mm``; no transposed copies.

    Kept for backward with ``save_mx_activations`` (the default): X's columnwise cast as
    MX codes and scales, decoded for the dW GEMM, and W itself, cast along N for the dX
    GEMM in backward; without it, both columnwise casts' values from forward."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, c: MXLinearConfig, weight_grad: bool
    ) -> torch.Tensor:
        x2 = as_rows(x)
        colwise = c.needs_colwise_input and weight_grad
        ctx.casts = casts = fused_casts(x2, weight, c, colwise)
        ctx.gathered_weight = False
        if casts is not None:  # the plain case: its casts' plans, directly
            xf, saved_x = casts.input(x2)
            wf_row, wf_col = casts.weight(weight)
        else:
            xf, saved_x = fake_quantized_input(x2, c, colwise)
            ctx.gathered_weight = fsdp_gathered.is_gathered(weight)  # FSDP gathered it in MX
            if ctx.gathered_weight:  # saved: backward's gather brings the colwise cast
                wf_row, wf_col = fsdp_gathered.rowwise_dequantized(weight, c), weight
            elif c.save_mx_activations and not weight_casts_kept():
                fn = mx_kernels.fake_quantize_rowwise  # inline: W is cast once
                wf_row, wf_col = cast_weight(fn, weight, c.weight_fmt, c, inline=True), None
            else:  # kept casts are held anyway: their columnwise values too
                fn = mx_kernels.fake_quantize_both  # inline: W is cast once
                wf_row, wf_col = cast_weight(fn, weight, c.weight_fmt, c, inline=True)
        y = _bf16_gemm(xf, wf_row.t(), x.dtype)
        # Saved: W's columnwise values (or W, cast in backward), and X's columnwise cast
        # where backward computes the MX dW, else X itself.
        ctx.recast_weight = wf_col is None
        ctx.save_for_backward(weight if wf_col is None else wf_col, *(saved_x or (x2,)))
        ctx.config, ctx.x_dtype, ctx.w_dtype = c, x.dtype, weight.dtype
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        c: MXLinearConfig = ctx.config
        wf_col, *saved_x = ctx.saved_tensors
        if ctx.gathered_weight:
            wf_col = fsdp_gathered.colwise_dequantized(wf_col, c)
        elif ctx.recast_weight and ctx.needs_input_grad[0]:
            if ctx.casts is not None:
                wf_col = ctx.casts.weight_colwise(wf_col)
            else:
                fn = mx_kernels.fake_quantize_colwise  # inline: W is cast once here
                wf_col = config_cast(fn, wf_col, c.weight_fmt, c, inline=True)
        dy = as_rows(reduced(grad_output))
        grad_x = grad_w = None
        if c.hp_weight_grad:
            if ctx.needs_input_grad[1]:
                grad_w = (dy.t() @ saved_x[0].to(dy.dtype)).to(ctx.w_dtype)
            fn = mx_kernels.fake_quantize_rowwise  # inline: dY is cast once
            dyf = config_cast(fn, dy, c.grad_output_fmt, c, inline=True)
        else:
            casts = ctx.casts and ctx.casts.grad_output(dy)
            if casts is not None:
                dyf, dyf_col = casts
            else:
                dy_pad = pad_rows(dy, c.block_size)  # colwise blocks run along M
                fn = mx_kernels.fake_quantize_both  # inline: dY is cast once
                dyf, dyf_col = config_cast(fn, dy_pad, c.grad_output_fmt, c, inline=True)
                if dy_pad is not dy:
                    dyf = dyf[: dy.shape[0]]
            if ctx.needs_input_grad[1]:  # saved_x: X cast along M in forward
                x_col = colwise_values(tuple(saved_x), c, ctx.x_dtype)
                grad_w = _bf16_gemm(dyf_col.t(), x_col, ctx.w_dtype)
        if ctx.needs_input_grad[0]:
            grad_x = _bf16_gemm(dyf, wf_col, ctx.x_dtype)
            if grad_output.dim() != 2:
                grad_x = grad_x.reshape(*grad_output.shape[:-1], wf_col.shape[1])
        return grad_x, grad_w, None, None


@contextlib.contextmanager
def route_bf16_gemms(
    gemm: Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor],
) -> Iterator[None]:
    """Inside, MXLinear's fused path (fake-quantized casts + bf16 GEMMs) runs its three
    GEMMs through ``gemm`` instead of ``mx_kernels.bf16_gemm``: for benchmarking the host
    cost of a step, e.g. with the GEMMs CUDA would run, on CPU
    (``tools/bench/host_cost.py --step``). The MX path (``scaled_mm``) is unaffected.

    Process-wide (every layer, every thread); nests, and restores the GEMM it found on
    exit, also on an exception.

    Args:
        gemm: called as ``mx_kernels.bf16_gemm`` is: ``gemm(a, b, out_dtype)`` with a
            [M, K] and b [K, N] of any strides and dtypes (the fake-quantized operands),
            returning ``a @ b`` [M, N] in ``out_dtype``.

    Raises:
        TypeError: ``gemm`` is not callable.
    """
    global _bf16_gemm
    if not callable(gemm):
        raise TypeError(f"route_bf16_gemms: gemm must be callable, got {type(gemm).__name__}")
    before, _bf16_gemm = _bf16_gemm, gemm
    try:
        yield
    finally:
        _bf16_gemm = before
