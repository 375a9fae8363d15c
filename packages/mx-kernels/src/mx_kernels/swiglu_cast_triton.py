"""Triton kernel of SwiGLU fused with the MX cast of its output.

Per element, in fp32, with torch's rounding steps for ``F.silu(gate) * up`` in the
inputs' dtype: ``s = round(g / (1 + exp(-g)))`` (torch's silu: computed in fp32, rounded
once), ``h = round(s * up)`` (the product of two values of the dtype, rounded once), each
``round`` to the dtype; then the MX cast of h from registers, rowwise and optionally
columnwise (``quantize_rowwise(h)`` / ``quantize_both(h)``'s codes and scales).

The division is IEEE-rounded (``div_rn``; Triton's ``/`` is not). exp is the only step
whose last bit is the math library's: on CUDA the kernel calls libdevice's ``expf``,
the function torch's CUDA silu calls; under the interpreter, numpy's, while torch's CPU
silu takes its own vectorised exp. Where the two exps differ, h can differ by one unit
in the last place of the dtype (fp32: often; bf16 and fp16: rarely, only next to a
rounding boundary).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from mx_core import ElementFormat
from mx_kernels.backend import interpreter_enabled
from mx_kernels.fused_cast_triton import (
    FusedTile,
    cast_constants,
    round_to_dtype,
    store_colwise_cast,
    store_rowwise_cast,
)
from mx_kernels.launch import KernelLauncher

__all__ = ["SWIGLU_TILES", "swiglu_cast_kernel", "swiglu_cast_triton"]

# GPU tiles. Rowwise: the best of tools/bench/fused.py --sweep on an H100 (1.00 of copy
# at 8192 and 16384 x 14336 against 0.83 for the casts' 8 x 1024); both: one MX block of
# rows (0.87 of copy there).
SWIGLU_TILES: dict[str, FusedTile] = {
    "rowwise": FusedTile(2, 2048, 4),
    "both": FusedTile(32, 128, 4),
}
# The interpreter's cost grows with the tile, masked rows and columns included.
_INTERPRETER_TILES = {"rowwise": FusedTile(2, 256, 4), "both": FusedTile(32, 32, 4)}


@triton.jit
def swiglu_cast_kernel(
    g_ptr, u_ptr, h_ptr, q_ptr, s_ptr, qt_ptr, st_ptr,
    M, K, stride_gm, stride_gk, stride_um, stride_uk, stride_sm, stride_sk,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, COLWISE: tl.constexpr, BS: tl.constexpr,
    FMT: tl.constexpr, MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
    MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr, EMIN: tl.constexpr,
    BITS: tl.constexpr, PACK: tl.constexpr, HW_ROUND: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):  # fmt: skip
    """h = silu(gate) * up of one [BLOCK_M, BLOCK_K] tile (a 1-D grid, along K first)
    of gate, up [M, K] into h [M, K] (contiguous, the inputs' dtype), and the MX cast of
    h: q [M, K // PACK] with scales s at strides (stride_sm, stride_sk); with COLWISE also
    the cast of h^T into qt [K, M // PACK] and its scale buffer st [M // BS, K]."""
    tiles_k = tl.cdiv(K, BLOCK_K)
    row_start = tl.program_id(0) // tiles_k * BLOCK_M
    k_start = tl.program_id(0) % tiles_k * BLOCK_K
    offs_m = row_start + tl.arange(0, BLOCK_M)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    g_ptrs = g_ptr + offs_m[:, None] * stride_gm + offs_k[None, :] * stride_gk
    u_ptrs = u_ptr + offs_m[:, None] * stride_um + offs_k[None, :] * stride_uk
    g = tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptrs, mask=mask, other=0.0).to(tl.float32)
    DT: tl.constexpr = h_ptr.dtype.element_ty
    if LIBDEVICE_EXP:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    s = round_to_dtype(tl.math.div_rn(g, 1.0 + e), DT, HW_ROUND)
    h = round_to_dtype(s * u, DT, HW_ROUND)
    tl.store(h_ptr + offs_m[:, None] * K + offs_k[None, :], h.to(DT), mask=mask)  # exact
    TOP: tl.constexpr = 15 if DT == tl.float16 else 127  # mx_core.top_exponent
    store_rowwise_cast(
        h, row_start, k_start, M, K, q_ptr, s_ptr, stride_sm, stride_sk, BLOCK_M, BLOCK_K,
        BS, FMT, MODE, EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, PACK, HW_ROUND, TOP,
    )  # fmt: skip
    if COLWISE:
        store_colwise_cast(
            h, row_start, k_start, M, K, qt_ptr, st_ptr, BLOCK_M, BLOCK_K, BS, FMT, MODE,
            EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, PACK, HW_ROUND, TOP,
        )  # fmt: skip


@functools.lru_cache(maxsize=256)
def _launcher(
    fmt: ElementFormat, block_size: int, scale_mode: str, colwise: bool, tile: FusedTile,
    hw_round: bool, libdevice_exp: bool,
) -> KernelLauncher:  # fmt: skip
    constants = dict(
        BLOCK_M=tile.block_m, BLOCK_K=tile.block_k, COLWISE=colwise,
        **cast_constants(fmt, block_size, scale_mode), HW_ROUND=hw_round,
        LIBDEVICE_EXP=libdevice_exp, num_warps=tile.warps,
    )  # fmt: skip
    return KernelLauncher(swiglu_cast_kernel, constants, tensors=7)


def swiglu_cast_triton(
    gate2d: torch.Tensor,
    up2d: torch.Tensor,
    fmt: ElementFormat,
    block_size: int,
    scale_mode: str,
    h: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    qt: torch.Tensor | None = None,
    st: torch.Tensor | None = None,
    tile: FusedTile | tuple | None = None,
    hw_round: bool | None = None,
) -> None:
    """Run :func:`swiglu_cast_kernel` into preallocated outputs (arguments already
    checked by :mod:`mx_kernels.swiglu_cast`).

    Args:
        gate2d, up2d: [M, K] of one dtype (fp32/bf16/fp16), any strides.
        h: [M, K] contiguous, their dtype.
        q, s: the rowwise codes [M, K // PACK] and scales [M, K // block_size] (row-major,
            or column-major: strides (1, M)).
        qt, st: the columnwise codes [K, M // PACK] and scale buffer [M // block_size, K]
            (both or neither; M a multiple of block_size).
        tile: overrides :data:`SWIGLU_TILES` (benchmarks); hw_round: the GPU's fp8 and
            bf16 conversions (default: on CUDA).
    """
    m, k = gate2d.shape
    if m == 0 or k == 0:
        return
    colwise = qt is not None
    cuda = gate2d.device.type == "cuda"
    if tile is None:
        tiles = _INTERPRETER_TILES if not cuda and interpreter_enabled() else SWIGLU_TILES
        tile = tiles["both" if colwise else "rowwise"]
    t = FusedTile(*tile)
    t = t._replace(block_k=max(t.block_k, block_size))
    if colwise:
        t = t._replace(block_m=max(t.block_m, block_size))
    launcher = _launcher(
        fmt, block_size, scale_mode, colwise, t, cuda if hw_round is None else hw_round, cuda
    )
    u8 = torch.uint8
    dummy = q.view(u8)[:0]  # the columnwise outputs when not written
    s_strides = (k // block_size, 1) if s.is_contiguous() else s.stride()
    grid = (triton.cdiv(m, t.block_m) * triton.cdiv(k, t.block_k),)
    launcher(
        grid, gate2d, up2d, h, q.view(u8), s.view(u8), dummy if qt is None else qt.view(u8),
        dummy if st is None else st.view(u8), m, k, *gate2d.stride(), *up2d.stride(), *s_strides,
    )  # fmt: skip
