"""What the fused producer kernels (:mod:`mx_kernels.norm_cast_triton`,
:mod:`mx_kernels.swiglu_cast_triton`) share: rounding an fp32 tile to the output dtype
in registers, the rowwise and columnwise MX casts of such a tile with their stores, and
the format constants the cast needs.

The block cast itself is :mod:`mx_kernels.cast_triton`'s (the same integer scale math
and element rounding as ``mx::quantize_*``), so a fused kernel's codes and scales are
those of ``quantize_rowwise`` / ``quantize_both`` of the tile it produced, bit for bit.
Outputs are uint8 views, as in the casts.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from mx_core import ElementFormat

# The block cast and the fp4 packer are module-private in cast_triton; the fused kernels
# call them rather than keep copies (the cast kernel's numerics stay in one place).
from mx_kernels.cast_triton import format_constants, mx_block_cast, pack_codes

__all__ = [
    "FusedTile",
    "cast_constants",
    "round_to_dtype",
    "store_colwise_cast",
    "store_rowwise_cast",
]


class FusedTile(NamedTuple):
    """How a fused kernel splits its [M, K] output: tiles of [block_m, block_k]
    elements, one program of ``warps`` warps each. What block_k 0 means is the kernel's
    (the norm: the whole row); ``stages`` software-pipelines the loads of a kernel that
    loops over tiles (the norm's rows in chunks)."""

    block_m: int
    block_k: int
    warps: int
    stages: int = 1


def cast_constants(fmt: ElementFormat, block_size: int, scale_mode: str) -> dict:
    """The constexprs of :func:`store_rowwise_cast` / :func:`store_colwise_cast`.
    Arguments as :func:`mx_kernels.cast_triton.format_constants`.

    Returns:
        :func:`mx_kernels.cast_triton.format_constants`'s dict (the same as the casts').
    """
    return format_constants(fmt, block_size, scale_mode)


@triton.jit
def round_to_dtype(v, DTYPE: tl.constexpr, HW_ROUND: tl.constexpr):
    """fp32 ``v`` rounded to ``DTYPE`` (fp32, bf16 or fp16; nearest, ties to even, as
    torch's ``.to(dtype)``), returned as fp32 (exact).

    HW_ROUND: the GPU's conversion. Otherwise bf16 is rounded on the bits: Triton's
    interpreter truncates fp32 -> bf16 (NaN and Inf keep their top bits).
    """
    out = v
    if DTYPE == tl.bfloat16:
        if HW_ROUND:
            out = v.to(tl.bfloat16).to(tl.float32)
        else:
            bits = v.to(tl.uint32, bitcast=True)
            bits += 0x7FFF + ((bits >> 16) & 1)
            out = ((bits >> 16) << 16).to(tl.float32, bitcast=True)
    elif DTYPE == tl.float16:
        out = v.to(tl.float16).to(tl.float32)
    return out


@triton.jit
def store_rowwise_cast(
    y, row_start, k_start, M, K, q_ptr, s_ptr, stride_sm, stride_sk,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr, FMT: tl.constexpr,
    MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr, MAX_NORMAL: tl.constexpr,
    MAX_FRAC: tl.constexpr, EMIN: tl.constexpr, BITS: tl.constexpr, PACK: tl.constexpr,
    HW_ROUND: tl.constexpr, TOP: tl.constexpr,
):  # fmt: skip
    """MX cast of the fp32 tile ``y`` [BLOCK_M, BLOCK_K] (rows ``row_start``..., columns
    ``k_start``... of an [M, K] tensor) with blocks along K: codes to q [M, K // PACK]
    (row-major), scales to s [M, K // BS] at strides (stride_sm, stride_sk). Elements
    outside [M, K] are not written. TOP: :func:`mx_core.top_exponent` of the dtype y
    stands for."""
    blocks = tl.reshape(y, (BLOCK_M, BLOCK_K // BS, BS))
    codes, scale = mx_block_cast(
        blocks, 2, FMT, MODE, EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, HW_ROUND, False, TOP
    )  # fmt: skip
    codes = pack_codes(tl.reshape(codes, (BLOCK_M, BLOCK_K)), PACK)
    offs_r = row_start + tl.arange(0, BLOCK_M)
    offs_q = k_start // PACK + tl.arange(0, BLOCK_K // PACK)
    q_mask = (offs_r[:, None] < M) & (offs_q[None, :] < K // PACK)
    tl.store(q_ptr + offs_r[:, None] * (K // PACK) + offs_q[None, :], codes, mask=q_mask)
    offs_s = k_start // BS + tl.arange(0, BLOCK_K // BS)
    s_mask = (offs_r[:, None] < M) & (offs_s[None, :] < K // BS)
    s_ptrs = s_ptr + offs_r[:, None] * stride_sm + offs_s[None, :] * stride_sk
    tl.store(s_ptrs, tl.reshape(scale, (BLOCK_M, BLOCK_K // BS)), mask=s_mask)


@triton.jit
def store_colwise_cast(
    y, row_start, k_start, M, K, qt_ptr, st_ptr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr, FMT: tl.constexpr,
    MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr, MAX_NORMAL: tl.constexpr,
    MAX_FRAC: tl.constexpr, EMIN: tl.constexpr, BITS: tl.constexpr, PACK: tl.constexpr,
    HW_ROUND: tl.constexpr, TOP: tl.constexpr,
):  # fmt: skip
    """MX cast of the fp32 tile ``y`` [BLOCK_M, BLOCK_K] with blocks along M (BLOCK_M a
    multiple of BS, ``row_start`` of BS), written as the cast of y^T in the layout of
    ``mx::quantize_both``: codes to q_t [K, M // PACK] row-major, scales to the buffer
    [M // BS, K] (row-major; the public scale_t is its transpose)."""
    blocks = tl.reshape(y, (BLOCK_M // BS, BS, BLOCK_K))
    codes, scale = mx_block_cast(
        blocks, 1, FMT, MODE, EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, HW_ROUND, False, TOP
    )  # fmt: skip
    codes_t = pack_codes(tl.trans(tl.reshape(codes, (BLOCK_M, BLOCK_K))), PACK)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    offs_q = row_start // PACK + tl.arange(0, BLOCK_M // PACK)
    q_mask = (offs_k[:, None] < K) & (offs_q[None, :] < M // PACK)
    tl.store(qt_ptr + offs_k[:, None] * (M // PACK) + offs_q[None, :], codes_t, mask=q_mask)
    offs_s = row_start // BS + tl.arange(0, BLOCK_M // BS)
    s_mask = (offs_s[:, None] < M // BS) & (offs_k[None, :] < K)
    s_ptrs = st_ptr + offs_s[:, None] * K + offs_k[None, :]
    tl.store(s_ptrs, tl.reshape(scale, (BLOCK_M // BS, BLOCK_K)), mask=s_mask)
