"""Triton kernels of RMSNorm fused with the MX cast of its output, and of its backward.

Forward (:func:`rms_norm_cast_kernel`): per row of x [M, K], in fp32,
``rstd = 1 / sqrt(sum(x^2) / K + eps)`` (IEEE-rounded division and square root, as
torch computes ``rsqrt(mean(x^2) + eps)`` on CPU), ``n = round(x * rstd)`` and
``y = round(n * weight)``, each ``round`` to x's dtype (Hugging Face's LlamaRMSNorm:
:func:`mx_kernels.norm_cast.rms_norm_reference`); then the MX cast of the rounded y
from registers, rowwise and optionally columnwise. Only the sum of squares depends on
the order of additions: given the same rstd, y is the reference's bit for bit, and its
codes and scales are ``quantize_rowwise(y)`` / ``quantize_both(y)``'s.

Backward (:func:`rms_norm_bwd_kernel`): ``dx = rstd * (g - n * mean(g * n))`` with
``g = dy * weight`` and n unrounded, in fp32; each program accumulates
``sum(dy * round(n))`` over its rows into its own row of an fp32 buffer (no atomics:
deterministic), which the launcher sums.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mx_core import ElementFormat
from mx_kernels.backend import interpreter_enabled, persistent_programs
from mx_kernels.dequant_triton import store_rounded
from mx_kernels.fused_cast_triton import (
    FusedTile,
    cast_constants,
    round_to_dtype,
    store_colwise_cast,
    store_rowwise_cast,
)
from mx_kernels.launch import KernelLauncher

__all__ = [
    "BACKWARD_TILE",
    "MAX_ONE_PASS_K",
    "NORM_TILES",
    "rms_norm_backward_triton",
    "rms_norm_bwd_kernel",
    "rms_norm_cast_kernel",
    "rms_norm_cast_triton",
]

MAX_ONE_PASS_K = 8192
"""Rows up to this many elements are held whole in registers (one read of x); longer
rows are read twice, in chunks of the tile's block_k (the second read mostly from L2)."""

# GPU tiles, not yet swept on a GPU; block_k 0: the whole row (next power of two of K)
# when K <= MAX_ONE_PASS_K, else 1024. "both" is BS rows tall (columnwise blocks) and so
# always goes in chunks.
NORM_TILES: dict[str, FusedTile] = {
    "rowwise": FusedTile(1, 0, 8),
    "both": FusedTile(32, 64, 4),
}
# The interpreter's cost grows with the tile, masked rows and columns included.
_INTERPRETER_TILES = {"rowwise": FusedTile(2, 0, 4), "both": FusedTile(32, 32, 4)}
BACKWARD_TILE = FusedTile(2, 0, 8)
"""The backward's rows per step, block_k (0 as above) and warps; 2 programs per SM."""


@triton.jit
def _rstd(ss, K, eps):
    """1 / sqrt(ss / K + eps), each step rounded to nearest (fp32)."""
    mean = tl.math.div_rn(ss, tl.zeros_like(ss) + K.to(tl.float32))
    return tl.math.div_rn(tl.zeros_like(ss) + 1.0, tl.math.sqrt_rn(mean + eps))


@triton.jit
def rms_norm_cast_kernel(
    x_ptr, w_ptr, y_ptr, rstd_ptr, q_ptr, s_ptr, qt_ptr, st_ptr,
    M, K, stride_xm, stride_xk, stride_sm, stride_sk, eps,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr,
    COLWISE: tl.constexpr, BS: tl.constexpr, FMT: tl.constexpr, MODE: tl.constexpr,
    EMAX: tl.constexpr, MBITS: tl.constexpr, MAX_NORMAL: tl.constexpr,
    MAX_FRAC: tl.constexpr, EMIN: tl.constexpr, BITS: tl.constexpr, PACK: tl.constexpr,
    HW_ROUND: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """RMSNorm of rows [pid * BLOCK_M, +BLOCK_M) of x [M, K] into y [M, K] (contiguous,
    x's dtype) and rstd [M] (fp32), and the MX cast of y: q [M, K // PACK] with scales s
    at strides (stride_sm, stride_sk); with COLWISE also the cast of y^T into qt
    [K, M // PACK] and its scale buffer st [M // BS, K] (BLOCK_M a multiple of BS).
    ONE_PASS: BLOCK_K >= K, the row is loaded once; otherwise twice, by chunks, with the
    loads pipelined over STAGES."""
    row_start = tl.program_id(0) * BLOCK_M
    offs_m = row_start + tl.arange(0, BLOCK_M)
    DT: tl.constexpr = y_ptr.dtype.element_ty
    if ONE_PASS:
        offs_k = tl.arange(0, BLOCK_K)
        mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
        x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        rstd = _rstd(tl.sum(x * x, axis=1), K, eps)
        tl.store(rstd_ptr + offs_m, rstd, mask=offs_m < M)
        _norm_cast_tile(
            x, rstd, w_ptr, y_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, row_start, 0, M, K,
            stride_sm, stride_sk, BLOCK_M, BLOCK_K, COLWISE, BS, FMT, MODE, EMAX, MBITS,
            MAX_NORMAL, MAX_FRAC, EMIN, BITS, PACK, HW_ROUND, DT,
        )  # fmt: skip
    else:
        ss = tl.zeros((BLOCK_M,), tl.float32)
        for k_start in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            offs_k = k_start + tl.arange(0, BLOCK_K)
            mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
            x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
            x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
            ss += tl.sum(x * x, axis=1)
        rstd = _rstd(ss, K, eps)
        tl.store(rstd_ptr + offs_m, rstd, mask=offs_m < M)
        for k_start in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            offs_k = k_start + tl.arange(0, BLOCK_K)
            mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
            x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
            x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
            _norm_cast_tile(
                x, rstd, w_ptr, y_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, row_start, k_start, M,
                K, stride_sm, stride_sk, BLOCK_M, BLOCK_K, COLWISE, BS, FMT, MODE, EMAX,
                MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, PACK, HW_ROUND, DT,
            )  # fmt: skip


@triton.jit
def _norm_cast_tile(
    x, rstd, w_ptr, y_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, row_start, k_start, M, K,
    stride_sm, stride_sk, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    COLWISE: tl.constexpr, BS: tl.constexpr, FMT: tl.constexpr, MODE: tl.constexpr,
    EMAX: tl.constexpr, MBITS: tl.constexpr, MAX_NORMAL: tl.constexpr,
    MAX_FRAC: tl.constexpr, EMIN: tl.constexpr, BITS: tl.constexpr, PACK: tl.constexpr,
    HW_ROUND: tl.constexpr, DT: tl.constexpr,
):  # fmt: skip
    """y of one [BLOCK_M, BLOCK_K] tile of x (fp32) given its rows' rstd; stores y and
    its casts."""
    offs_m = row_start + tl.arange(0, BLOCK_M)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    w = tl.load(w_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    n = round_to_dtype(x * rstd[:, None], DT, HW_ROUND)
    y = round_to_dtype(n * w[None, :], DT, HW_ROUND)
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    tl.store(y_ptr + offs_m[:, None] * K + offs_k[None, :], y.to(DT), mask=mask)  # exact
    TOP: tl.constexpr = 15 if DT == tl.float16 else 127  # mx_core.top_exponent
    store_rowwise_cast(
        y, row_start, k_start, M, K, q_ptr, s_ptr, stride_sm, stride_sk, BLOCK_M, BLOCK_K,
        BS, FMT, MODE, EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, PACK, HW_ROUND, TOP,
    )  # fmt: skip
    if COLWISE:
        store_colwise_cast(
            y, row_start, k_start, M, K, qt_ptr, st_ptr, BLOCK_M, BLOCK_K, BS, FMT, MODE,
            EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, PACK, HW_ROUND, TOP,
        )  # fmt: skip


@triton.jit
def rms_norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dwp_ptr,
    M, K, stride_dym, stride_dyk, stride_xm, stride_xk, ROWS_PER_PROGRAM,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr,
    HW_ROUND: tl.constexpr,
):  # fmt: skip
    """dx [M, K] (contiguous, x's dtype) of rows [pid * ROWS_PER_PROGRAM, +ROWS_PER_PROGRAM)
    and this program's partial weight gradient, row pid of dwp [programs, K] (fp32,
    zero-filled), BLOCK_M rows at a time."""
    pid = tl.program_id(0)
    first = pid * ROWS_PER_PROGRAM
    last = tl.minimum(first + ROWS_PER_PROGRAM, M)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    if ONE_PASS:
        offs_k = tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        acc = tl.zeros((BLOCK_K,), tl.float32)
        for i in range(0, ROWS_PER_PROGRAM, BLOCK_M):
            offs_m = first + i + tl.arange(0, BLOCK_M)
            mask = (offs_m[:, None] < last) & (offs_k[None, :] < K)
            rstd = tl.load(rstd_ptr + offs_m, mask=offs_m < last, other=0.0)
            x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
            x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
            dy_ptrs = dy_ptr + offs_m[:, None] * stride_dym + offs_k[None, :] * stride_dyk
            dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
            n = x * rstd[:, None]
            g = dy * w[None, :]
            c = tl.sum(g * n, axis=1) / K
            dx = (g - n * c[:, None]) * rstd[:, None]
            store_rounded(dx_ptr + offs_m[:, None] * K + offs_k[None, :], dx, mask, HW_ROUND)
            acc += tl.sum(dy * round_to_dtype(n, DT, HW_ROUND), axis=0)
        tl.store(dwp_ptr + pid * K + offs_k, acc, mask=offs_k < K)
    else:
        for i in range(0, ROWS_PER_PROGRAM, BLOCK_M):
            offs_m = first + i + tl.arange(0, BLOCK_M)
            rstd = tl.load(rstd_ptr + offs_m, mask=offs_m < last, other=0.0)
            c = tl.zeros((BLOCK_M,), tl.float32)
            for k_start in range(0, K, BLOCK_K):
                offs_k = k_start + tl.arange(0, BLOCK_K)
                mask = (offs_m[:, None] < last) & (offs_k[None, :] < K)
                x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
                x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
                dy_ptrs = dy_ptr + offs_m[:, None] * stride_dym + offs_k[None, :] * stride_dyk
                dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
                c += tl.sum(dy * w[None, :] * x, axis=1)
            c = c * rstd / K
            for k_start in range(0, K, BLOCK_K):
                offs_k = k_start + tl.arange(0, BLOCK_K)
                mask = (offs_m[:, None] < last) & (offs_k[None, :] < K)
                x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
                x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
                dy_ptrs = dy_ptr + offs_m[:, None] * stride_dym + offs_k[None, :] * stride_dyk
                dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
                n = x * rstd[:, None]
                dx = (dy * w[None, :] - n * c[:, None]) * rstd[:, None]
                dx_ptrs = dx_ptr + offs_m[:, None] * K + offs_k[None, :]
                store_rounded(dx_ptrs, dx, mask, HW_ROUND)
                p_ptrs = dwp_ptr + pid * K + offs_k
                partial = tl.load(p_ptrs, mask=offs_k < K, other=0.0)
                partial += tl.sum(dy * round_to_dtype(n, DT, HW_ROUND), axis=0)
                tl.store(p_ptrs, partial, mask=offs_k < K)


def _block_k(tile: FusedTile, k: int, block_size: int) -> int:
    if tile.block_k:
        return max(tile.block_k, block_size)
    whole = triton.next_power_of_2(k)
    return max(whole if whole <= MAX_ONE_PASS_K else 1024, block_size)


@functools.lru_cache(maxsize=256)
def _forward_launcher(
    fmt: ElementFormat, block_size: int, scale_mode: str, colwise: bool, tile: FusedTile,
    block_k: int, one_pass: bool, hw_round: bool,
) -> KernelLauncher:  # fmt: skip
    constants = dict(
        BLOCK_M=tile.block_m, BLOCK_K=block_k, ONE_PASS=one_pass, COLWISE=colwise,
        **cast_constants(fmt, block_size, scale_mode), HW_ROUND=hw_round, STAGES=tile.stages,
        num_warps=tile.warps,
    )  # fmt: skip
    return KernelLauncher(rms_norm_cast_kernel, constants, tensors=8)


def rms_norm_cast_triton(
    x2d: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    fmt: ElementFormat,
    block_size: int,
    scale_mode: str,
    y: torch.Tensor,
    rstd: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    qt: torch.Tensor | None = None,
    st: torch.Tensor | None = None,
    tile: FusedTile | tuple | None = None,
    hw_round: bool | None = None,
) -> None:
    """Run :func:`rms_norm_cast_kernel` into preallocated outputs (arguments already
    checked by :mod:`mx_kernels.norm_cast`).

    Args:
        x2d: [M, K] fp32/bf16/fp16, any strides; weight: [K] contiguous.
        y: [M, K] contiguous, x's dtype; rstd: [M] fp32.
        q, s: the rowwise codes [M, K // PACK] and scales [M, K // block_size] (row-major,
            or column-major: strides (1, M)).
        qt, st: the columnwise codes [K, M // PACK] and scale buffer [M // block_size, K]
            (both or neither; M a multiple of block_size).
        tile: overrides :data:`NORM_TILES` (benchmarks); hw_round: the GPU's fp8 and bf16
            conversions (default: on CUDA).
    """
    m, k = x2d.shape
    if m == 0 or k == 0:
        return
    colwise = qt is not None
    kind = "both" if colwise else "rowwise"
    cuda = x2d.device.type == "cuda"
    default = NORM_TILES if cuda or not interpreter_enabled() else _INTERPRETER_TILES
    t = FusedTile(*(tile or default[kind]))
    if colwise:
        t = t._replace(block_m=max(t.block_m, block_size))
    block_k = _block_k(t, k, block_size)
    one_pass = block_k >= k
    launcher = _forward_launcher(
        fmt, block_size, scale_mode, colwise, t, block_k, one_pass,
        cuda if hw_round is None else hw_round,
    )  # fmt: skip
    u8 = torch.uint8
    dummy = q.view(u8)[:0]  # the columnwise outputs when not written
    s_strides = (k // block_size, 1) if s.is_contiguous() else s.stride()
    launcher(
        (triton.cdiv(m, t.block_m),), x2d, weight, y, rstd, q.view(u8), s.view(u8),
        dummy if qt is None else qt.view(u8), dummy if st is None else st.view(u8),
        m, k, *x2d.stride(), *s_strides, float(eps),
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def _backward_launcher(block_m: int, block_k: int, one_pass: bool, warps: int, hw_round: bool):
    constants = dict(
        BLOCK_M=block_m, BLOCK_K=block_k, ONE_PASS=one_pass, HW_ROUND=hw_round, num_warps=warps
    )
    return KernelLauncher(rms_norm_bwd_kernel, constants, tensors=6)


def rms_norm_backward_triton(
    dy2d: torch.Tensor,
    x2d: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    tile: FusedTile | tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run :func:`rms_norm_bwd_kernel` (arguments checked by :mod:`mx_kernels.norm_cast`).

    Args:
        dy2d, x2d: [M, K], any strides (x fp32/bf16/fp16, dy any of them); weight: [K]
            contiguous; rstd: [M] fp32 contiguous.
    Returns:
        ``(dx [M, K] contiguous in x's dtype, dweight [K] in weight's dtype)``.
    """
    m, k = x2d.shape
    dx = torch.empty((m, k), dtype=x2d.dtype, device=x2d.device)
    if m == 0 or k == 0:
        return dx, torch.zeros_like(weight)
    t = FusedTile(*(tile or BACKWARD_TILE))
    block_k = _block_k(t, k, 1)
    programs = min(persistent_programs(x2d.device, 2), triton.cdiv(m, t.block_m))
    rows = triton.cdiv(m, programs)
    partial = torch.zeros((programs, k), dtype=torch.float32, device=x2d.device)
    launcher = _backward_launcher(
        t.block_m, block_k, block_k >= k, t.warps, x2d.device.type == "cuda"
    )
    launcher(
        (programs,), dy2d, x2d, weight, rstd, dx, partial, m, k, *dy2d.stride(), *x2d.stride(),
        rows,
    )  # fmt: skip
    return dx, partial.sum(0).to(weight.dtype)
