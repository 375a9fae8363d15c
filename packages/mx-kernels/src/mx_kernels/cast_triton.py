"""Triton kernels of the MX casts: rowwise, columnwise, and both in one pass.

Every kernel loads a [BLOCK_M, BLOCK_K] tile of the high-precision input once, finds
each MX block's amax as an integer max over the fp32 bit patterns with the sign cleared
(NaN > Inf > any finite number in that order, so non-finite blocks are found for free),
derives the E8M0 exponent with the integer formulas of :mod:`mx_core.scale`, and
writes element codes (fp8; fp6 one per byte; fp4 two per byte, low nibble first) and
scale bytes. The results are bit-identical to :func:`mx_core.quantize`.

Outputs are passed as uint8 views (Triton's interpreter rejects float8_e8m0fnu args).
"""

from __future__ import annotations

import triton
import triton.language as tl

from mx_core import ElementFormat
from mx_kernels.dequant_triton import store_rounded

__all__ = [
    "FMT_IDS",
    "MODE_IDS",
    "format_constants",
    "mx_block_cast",
    "mx_cast_kernel",
    "pack_codes",
]

# Scale modes and element formats as kernel constants.
MODE_FLOOR = tl.constexpr(0)
MODE_CEIL = tl.constexpr(1)
MODE_EVEN = tl.constexpr(2)
MODE_RCEIL = tl.constexpr(3)
FMT_E4M3 = tl.constexpr(0)
FMT_E5M2 = tl.constexpr(1)
FMT_CODES = tl.constexpr(2)  # fp6 / fp4: codes built in integer arithmetic
MODE_IDS = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
FMT_IDS = {"fp8_e4m3": 0, "fp8_e5m2": 1, "fp6_e2m3": 2, "fp6_e3m2": 2, "fp4_e2m1": 2}


@triton.jit
def _round_to_grid(x, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_NORMAL: tl.constexpr):
    """Round fp32 x to the element grid (nearest, ties to even), saturating; fp32 out."""
    a = tl.minimum(tl.abs(x), MAX_NORMAL)
    a_exp = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, EMIN)
    q_exp = a_exp - MBITS  # the grid spacing is 2^q_exp; subnormals share EMIN's
    quantum = ((q_exp + 127) << 23).to(tl.float32, bitcast=True)
    steps = a * ((127 - q_exp) << 23).to(tl.float32, bitcast=True)  # exact: a / quantum
    # Adding and removing 2^23 rounds a value in [0, 2^23) to an integer, ties to even.
    steps = (steps + 8388608.0) - 8388608.0
    bits = (steps * quantum).to(tl.int32, bitcast=True)
    sign = x.to(tl.int32, bitcast=True) & -2147483648
    return (bits | sign).to(tl.float32, bitcast=True)


@triton.jit
def _encode_codes(r, MBITS: tl.constexpr, EMIN: tl.constexpr, BITS: tl.constexpr):
    """Codes (uint8, sign in bit BITS-1) of fp32 values already on the element grid."""
    r_bits = r.to(tl.int32, bitcast=True)
    a = tl.abs(r)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    normal = e >= EMIN
    e_field = tl.where(normal, e - EMIN + 1, 0)
    frac_normal = (a.to(tl.int32, bitcast=True) >> (23 - MBITS)) & ((1 << MBITS) - 1)
    frac_sub = (a * (2.0 ** (MBITS - EMIN))).to(tl.int32)  # a / smallest subnormal
    frac = tl.where(normal, frac_normal, frac_sub)
    sign = (r_bits >> 31) & 1
    return ((sign << (BITS - 1)) | (e_field << MBITS) | frac).to(tl.uint8)


@triton.jit
def _nan_max(a, b):
    # NaN must win (a block holding NaN gets the NaN scale); a plain max drops it.
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


def format_constants(fmt: ElementFormat, block_size: int, scale_mode: str) -> dict:
    """The format, block and scale-mode constexprs of :func:`mx_block_cast`, which the
    casts' launches and the fused kernels' share.

    Args:
        fmt: the mx-core ``ElementFormat``.
        block_size: elements per scale.
        scale_mode: a scale mode's canonical name (``"rceil"``...).
    Returns:
        The ten keyword constexprs ``BS``, ``FMT``, ``MODE``, ``EMAX``, ``MBITS``,
        ``MAX_NORMAL``, ``MAX_FRAC``, ``EMIN``, ``BITS`` and ``PACK`` (codes per byte).
    """
    return dict(
        BS=block_size,
        FMT=FMT_IDS[fmt.name],
        MODE=MODE_IDS[scale_mode],
        EMAX=fmt.emax,
        MBITS=fmt.mbits,
        MAX_NORMAL=fmt.max_normal,
        MAX_FRAC=fmt.max_normal_mantissa_bits,
        EMIN=fmt.emin,
        BITS=fmt.bits,
        PACK=2 if fmt.is_packed else 1,
    )


@triton.jit
def mx_block_cast(
    blocks,
    AXIS: tl.constexpr,
    FMT: tl.constexpr,
    MODE: tl.constexpr,
    EMAX: tl.constexpr,
    MBITS: tl.constexpr,
    MAX_NORMAL: tl.constexpr,
    MAX_FRAC: tl.constexpr,
    EMIN: tl.constexpr,
    BITS: tl.constexpr,
    HW_ROUND: tl.constexpr,
    DEQ: tl.constexpr,
    TOP: tl.constexpr,
):
    """Quantize ``blocks`` (fp32, one MX block along ``AXIS``) -> (codes u8, scale u8),
    or with DEQ -> (the dequantized values, fp32, NaN for a NaN scale; scale u8).

    The scale keeps ``AXIS`` with size 1. EMAX, MBITS, MAX_NORMAL and MAX_FRAC (the fp32
    fraction field of MAX_NORMAL), EMIN (exponent of the smallest normal) and BITS describe
    the element format. HW_ROUND lets the fp32 -> fp8 conversion round (GPUs); otherwise,
    and always for fp6/fp4, values are rounded in fp32 arithmetic. TOP is the exponent of
    the input dtype's largest power of two (:func:`mx_core.top_exponent`).
    """
    amax = tl.reduce(tl.abs(blocks), AXIS, _nan_max, keep_dims=True)
    amax_bits = amax.to(tl.int32, bitcast=True)
    biased = (amax_bits >> 23) & 0xFF
    nonfinite = biased == 255
    # The exponent of amax rounded to MBITS mantissa bits (the even mode's exponent).
    rounded = ((amax_bits + (1 << (22 - MBITS))) >> 23) & 0xFF
    if MODE == MODE_EVEN:
        biased = rounded
    e = biased - (127 + EMAX)
    if MODE == MODE_CEIL:
        e += ((amax_bits & 0x7FFFFF) != 0).to(tl.int32)
    if MODE == MODE_RCEIL:
        e += ((amax_bits & 0x7FFFFF) > MAX_FRAC).to(tl.int32)
    if MODE != MODE_FLOOR:
        # Where the block would decode past the input dtype, the floor exponent, whose
        # elements saturate (mx_core.scale; the floor mode never gets there).
        e = tl.where(rounded > 127 + TOP, TOP - EMAX, e)
    e = tl.minimum(tl.maximum(e, -127), 127)
    scale = tl.where(nonfinite, 255, e + 127).to(tl.uint8)
    # 2^-e from its fp32 bits; only e = 127 would need the subnormal 2^-127.
    inv_bits = tl.where(e == 127, 1 << 22, (127 - e) << 23)
    if HW_ROUND and FMT != FMT_CODES:
        # A NaN multiplier makes every element of a non-finite block NaN, which the
        # conversion writes as the NaN code: one select per block, not per element.
        inv_bits = tl.where(nonfinite, 0x7FC00000, inv_bits)
    scaled = blocks * inv_bits.to(tl.float32, bitcast=True)
    if FMT == FMT_CODES:
        values = _round_to_grid(scaled, MBITS, EMIN, MAX_NORMAL)
        codes = _encode_codes(values, MBITS, EMIN, BITS)
        codes = tl.where(nonfinite, 0, codes).to(tl.uint8)  # no NaN code: the scale says NaN
    else:
        # On GPUs the conversion below is cvt.rn.satfinite (sm89+): it rounds to nearest
        # even and saturates, as mx-core does, so it needs no clamp.
        if not HW_ROUND:
            # Round in fp32 so that the conversion below is exact. Triton's interpreter
            # drops the carry when fp32 -> fp8 rounding overflows the mantissa (127.3 ->
            # 64, not 128): triton-lang/triton#8322, fix proposed in triton-lang/triton#11897.
            scaled = _round_to_grid(scaled, MBITS, EMIN, MAX_NORMAL)
        if FMT == FMT_E4M3:
            q = scaled.to(tl.float8e4nv)
        else:
            q = scaled.to(tl.float8e5)
        codes = q.to(tl.uint8, bitcast=True)
        if not HW_ROUND:
            codes = tl.where(nonfinite, 0x7F, codes).to(tl.uint8)
        values = q.to(tl.float32)
    if DEQ:
        # value * 2^e is exact in fp32 (down to 2^-127 * 2^-9), as mx-core computes it;
        # a NaN scale (non-finite block) makes the whole block NaN, as it does there.
        scale_bits = tl.where(e == -127, 1 << 22, (e + 127) << 23)
        scale_bits = tl.where(nonfinite, 0x7FC00000, scale_bits)
        codes = values * scale_bits.to(tl.float32, bitcast=True)
    return codes, scale  # one return: see pack_codes


@triton.jit
def pack_codes(codes, PACK: tl.constexpr):
    """[R, C] uint8 codes -> [R, C // PACK]: PACK = 2 puts pairs in one byte, low first."""
    # One return: triton 3.6 rejects returns of different shapes even under a constexpr if.
    if PACK == 2:
        low, high = tl.split(tl.reshape(codes, (codes.shape[0], codes.shape[1] // 2, 2)))
        codes = low | (high << 4)
    return codes


@triton.jit
def _blocked_offsets(r, c, C):
    """Byte offsets of elements (r, c) of a scale matrix [R, C] in cuBLAS's blocked
    layout (:mod:`mx_kernels.swizzle`): padded to [ceil128(R), ceil4(C)], 128x4 tiles in
    row-major tile order, 512 bytes each, tile element (r % 128, c % 4) at byte
    (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4."""
    tile = (r // 128) * ((C + 3) // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4


@triton.jit
def _grid_extent(n, BLOCKED: tl.constexpr):
    """How far along a dim of size n the grid runs: n, or with BLOCKED ceil128(n), which
    with blocks of 32 is where the blocked layout's padding ends along both dims of x
    (rows of one cast's scales, 4 blocks of columns of the other's)."""
    if BLOCKED:
        n = (n + 127) // 128 * 128
    return n


@triton.jit
def mx_cast_kernel(
    x_ptr, q_row_ptr, s_row_ptr, q_col_ptr, s_col_ptr,
    M, K, stride_xm, stride_xk, stride_sm, stride_sk, TILES_PER_PROGRAM,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr,
    FMT: tl.constexpr, MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
    MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr, EMIN: tl.constexpr, BITS: tl.constexpr,
    PACK: tl.constexpr, HW_ROUND: tl.constexpr, ROWWISE: tl.constexpr, COLWISE: tl.constexpr,
    DEQ: tl.constexpr, DEQ_COL: tl.constexpr, PERSISTENT: tl.constexpr, STAGES: tl.constexpr,
    K_FIRST: tl.constexpr, LANES_M: tl.constexpr, S_ROW_T: tl.constexpr, WORDS_T: tl.constexpr,
    BLOCKED: tl.constexpr,
):  # fmt: skip
    """Rowwise and/or columnwise MX cast of x [M, K], tile by [BLOCK_M, BLOCK_K] tile.

    Rowwise writes q [M, K // PACK] and s [M, K // BS]: row-major, or with S_ROW_T
    column-major at strides (stride_sm, stride_sk) = (1, M). Columnwise writes the cast of
    x^T: q_t [K, M // PACK] row-major and its scales s_t [K, M // BS] stored column-major
    (as the row-major [M // BS, K] buffer s_t.t()). PACK = 2 packs fp4 codes two per
    byte along the blocked dim. All outputs are uint8 views. BLOCKED (BS = 32) writes each
    scale matrix instead as the 1-D bytes of cuBLAS's blocked layout
    (:func:`_blocked_offsets`), padding included: the grid then covers x padded to
    [ceil128(M), ceil128(K)], whose masked loads make all-zero blocks, and an all-zero
    block's scale is byte 0, the padding's value.

    DEQ (fake quantization) writes the rowwise cast's dequantized values instead, rounded
    to the output's dtype, in x's [M, K] layout (contiguous), and no scales; DEQ_COL the
    same of the columnwise cast. DEQ without DEQ_COL: the rowwise values and the
    columnwise codes and scales, from one read of x.

    Grid: one program per tile, in launch order down M first (a 2-D grid) or with
    K_FIRST along K first (a 1-D grid); or PERSISTENT: a 1-D grid whose programs each
    take TILES_PER_PROGRAM tiles, strided by the grid size, with the next tile's load
    software-pipelined over STAGES (more bytes in flight per warp). Tiles past the end
    fall outside x and every mask.
    """
    if PERSISTENT:
        tiles_k = tl.cdiv(_grid_extent(K, BLOCKED), BLOCK_K)
        for i in tl.range(0, TILES_PER_PROGRAM, num_stages=STAGES):
            tile = tl.program_id(0) + i * tl.num_programs(0)
            _cast_tile(
                x_ptr, q_row_ptr, s_row_ptr, q_col_ptr, s_col_ptr, M, K, stride_xm, stride_xk,
                stride_sm, stride_sk, tile // tiles_k, tile % tiles_k, BLOCK_M, BLOCK_K, BS,
                FMT, MODE, EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, PACK, HW_ROUND,
                ROWWISE, COLWISE, DEQ, DEQ_COL, LANES_M, S_ROW_T, WORDS_T, BLOCKED,
            )  # fmt: skip
    elif K_FIRST:
        tiles_k = tl.cdiv(_grid_extent(K, BLOCKED), BLOCK_K)
        _cast_tile(
            x_ptr, q_row_ptr, s_row_ptr, q_col_ptr, s_col_ptr, M, K, stride_xm, stride_xk,
            stride_sm, stride_sk, tl.program_id(0) // tiles_k, tl.program_id(0) % tiles_k,
            BLOCK_M, BLOCK_K, BS, FMT, MODE, EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, PACK,
            HW_ROUND, ROWWISE, COLWISE, DEQ, DEQ_COL, LANES_M, S_ROW_T, WORDS_T, BLOCKED,
        )  # fmt: skip
    else:
        _cast_tile(
            x_ptr, q_row_ptr, s_row_ptr, q_col_ptr, s_col_ptr, M, K, stride_xm, stride_xk,
            stride_sm, stride_sk, tl.program_id(0), tl.program_id(1), BLOCK_M, BLOCK_K, BS,
            FMT, MODE, EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, PACK, HW_ROUND, ROWWISE,
            COLWISE, DEQ, DEQ_COL, LANES_M, S_ROW_T, WORDS_T, BLOCKED,
        )  # fmt: skip


@triton.jit
def _cast_tile(
    x_ptr, q_row_ptr, s_row_ptr, q_col_ptr, s_col_ptr,
    M, K, stride_xm, stride_xk, stride_sm, stride_sk, pid_m, pid_k,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr,
    FMT: tl.constexpr, MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
    MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr, EMIN: tl.constexpr, BITS: tl.constexpr,
    PACK: tl.constexpr, HW_ROUND: tl.constexpr, ROWWISE: tl.constexpr, COLWISE: tl.constexpr,
    DEQ: tl.constexpr, DEQ_COL: tl.constexpr, LANES_M: tl.constexpr, S_ROW_T: tl.constexpr,
    WORDS_T: tl.constexpr, BLOCKED: tl.constexpr,
):  # fmt: skip
    """Tile (pid_m, pid_k) of :func:`mx_cast_kernel`.

    LANES_M > 0 loads the tile's rows permuted so that each warp holds whole MX blocks
    of rows (see below); BLOCK_M must then be num_warps * BS. WORDS_T (LANES_M = BS / 4,
    one code per byte) stores the codes of x^T as 32-bit words of four rows.
    """
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # x's rows in memory order
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rows = tl.arange(0, BLOCK_M)
    if LANES_M:
        # Triton spreads a tile's rows LANES_M to a warp, then to the next warp, then
        # repeats. Held row i is x's row (warp * BS + repeat * LANES_M + lane), so that
        # each warp holds one whole MX block of rows: the columnwise amax then needs no
        # exchange between warps, and a tile can be BLOCK_M = num_warps * BS tall.
        w = BLOCK_M // BS
        if WORDS_T:
            # Instead each thread's repeats are consecutive rows (lane * 4 + repeat), so
            # that it holds four rows' codes to pack into one word of x^T's row.
            rows = (rows // LANES_M % w) * BS + rows % LANES_M * 4 + rows // (LANES_M * w)
        else:
            rows = (rows // LANES_M % w) * BS + rows // (LANES_M * w) * LANES_M + rows % LANES_M
    offs_r = pid_m * BLOCK_M + rows  # x's rows in the order the tile holds them
    mask = (offs_r[:, None] < M) & (offs_k[None, :] < K)
    x_ptrs = x_ptr + offs_r[:, None] * stride_xm + offs_k[None, :] * stride_xk
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    TOP: tl.constexpr = 15 if x_ptr.dtype.element_ty == tl.float16 else 127  # mx_core.top_exponent
    if ROWWISE:
        blocks = tl.reshape(x, (BLOCK_M, BLOCK_K // BS, BS))
        codes, scale = mx_block_cast(
            blocks, 2, FMT, MODE, EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, HW_ROUND, DEQ, TOP
        )  # fmt: skip
        if DEQ:
            out_ptrs = q_row_ptr + offs_r[:, None] * K + offs_k[None, :]
            store_rounded(out_ptrs, tl.reshape(codes, (BLOCK_M, BLOCK_K)), mask, HW_ROUND)
        else:
            codes = pack_codes(tl.reshape(codes, (BLOCK_M, BLOCK_K)), PACK)
            offs_q = pid_k * (BLOCK_K // PACK) + tl.arange(0, BLOCK_K // PACK)
            q_mask = (offs_r[:, None] < M) & (offs_q[None, :] < K // PACK)
            q_ptrs = q_row_ptr + offs_r[:, None] * (K // PACK) + offs_q[None, :]
            tl.store(q_ptrs, codes, mask=q_mask)
            offs_s = pid_k * (BLOCK_K // BS) + tl.arange(0, BLOCK_K // BS)
            if BLOCKED:  # the padding too (all-zero blocks: scale byte 0)
                s_mask = (offs_r[:, None] < _grid_extent(M, BLOCKED)) & (
                    offs_s[None, :] < (K // BS + 3) // 4 * 4
                )
            else:
                s_mask = (offs_r[:, None] < M) & (offs_s[None, :] < K // BS)
            # Column-major through the runtime strides (stride_sm == 1, specialised by
            # Triton): the exact form measured on the H200 (BENCHMARKS.md,
            # 2026-12-03 'Casts: column-major rowwise scales').
            if S_ROW_T:
                s_ptrs = s_row_ptr + offs_r[:, None] * stride_sm + offs_s[None, :] * stride_sk
            elif BLOCKED:
                s_ptrs = s_row_ptr + _blocked_offsets(offs_r[:, None], offs_s[None, :], K // BS)
            else:
                s_ptrs = s_row_ptr + offs_r[:, None] * (K // BS) + offs_s[None, :]
            tl.store(s_ptrs, tl.reshape(scale, (BLOCK_M, BLOCK_K // BS)), mask=s_mask)
    if COLWISE:
        if LANES_M:  # back to memory order: [repeat, warp, lane, K] -> [block, row, K]
            blocks = tl.reshape(x, (BS // LANES_M, BLOCK_M // BS, LANES_M, BLOCK_K))
            blocks = tl.reshape(tl.permute(blocks, (1, 0, 2, 3)), (BLOCK_M // BS, BS, BLOCK_K))
        else:
            blocks = tl.reshape(x, (BLOCK_M // BS, BS, BLOCK_K))
        codes, scale = mx_block_cast(
            blocks, 1, FMT, MODE, EMAX, MBITS, MAX_NORMAL, MAX_FRAC, EMIN, BITS, HW_ROUND,
            DEQ_COL, TOP,
        )  # fmt: skip
        if DEQ_COL:
            out_ptrs = q_col_ptr + offs_m[:, None] * K + offs_k[None, :]
            mask_m = (offs_m[:, None] < M) & (offs_k[None, :] < K)
            store_rounded(out_ptrs, tl.reshape(codes, (BLOCK_M, BLOCK_K)), mask_m, HW_ROUND)
        elif WORDS_T:
            # Four rows' codes, held by one thread, make one little-endian 32-bit word of
            # x^T's row: the transpose then moves words, not bytes, through shared memory.
            codes = tl.reshape(codes, (BLOCK_M // BS, 4, LANES_M, BLOCK_K)).to(tl.int32)
            shifts = (tl.arange(0, 4) * 8)[None, :, None, None]
            words = tl.reshape(tl.sum(codes << shifts, axis=1), (BLOCK_M // 4, BLOCK_K))
            offs_w = pid_m * (BLOCK_M // 4) + tl.arange(0, BLOCK_M // 4)
            mask_t = (offs_k[:, None] < K) & (offs_w[None, :] < M // 4)
            w_ptrs = q_col_ptr.to(tl.pointer_type(tl.int32)) + offs_k[:, None] * (M // 4)
            tl.store(w_ptrs + offs_w[None, :], tl.trans(words), mask=mask_t)
        else:
            codes_t = pack_codes(tl.trans(tl.reshape(codes, (BLOCK_M, BLOCK_K))), PACK)
            offs_q = pid_m * (BLOCK_M // PACK) + tl.arange(0, BLOCK_M // PACK)
            mask_t = (offs_k[:, None] < K) & (offs_q[None, :] < M // PACK)
            q_ptrs = q_col_ptr + offs_k[:, None] * (M // PACK) + offs_q[None, :]
            tl.store(q_ptrs, codes_t, mask=mask_t)
        if not DEQ_COL:
            # The scales of x^T are stored [M // BS, K] (see mx_kernels.cast): whole rows
            # of BLOCK_K bytes, not BLOCK_M // BS bytes in each of BLOCK_K rows.
            offs_s = pid_m * (BLOCK_M // BS) + tl.arange(0, BLOCK_M // BS)
            if BLOCKED:  # the padding too, as above
                s_mask = (offs_s[:, None] < (M // BS + 3) // 4 * 4) & (
                    offs_k[None, :] < _grid_extent(K, BLOCKED)
                )
            else:
                s_mask = (offs_s[:, None] < M // BS) & (offs_k[None, :] < K)
            if BLOCKED:  # x^T's scale matrix [K, M // BS]: row k, column offs_s
                s_ptrs = s_col_ptr + _blocked_offsets(offs_k[None, :], offs_s[:, None], M // BS)
            else:
                s_ptrs = s_col_ptr + offs_s[:, None] * K + offs_k[None, :]
            tl.store(s_ptrs, tl.reshape(scale, (BLOCK_M // BS, BLOCK_K)), mask=s_mask)
