"""Triton kernels of the MX scaled matmul ``C[M, N] = A[M, K] @ B[N, K]^T``.

Both operands are K-major; A and B are read through TMA tensor descriptors (which
zero-fill out of bounds, so M, N and K need not be tile multiples), E8M0 scales through
pointer loads as uint8 (Triton's interpreter rejects float8_e8m0fnu kernel args). The
kernels are persistent: ``min(#SMs, #tiles)`` programs walk the output tiles in
grouped order (GROUP_M tile rows at a time, so B tiles stay in L2).

Three designs, selectable by ``design=`` (the benchmark measures each):

- ``"dot_scaled"``: ``tl.dot_scaled`` on [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] tiles.
  On sm100 it is the native block-scaled MMA; on sm90 Triton upcasts both operands
  to bf16 (applying the scales) and runs a bf16 wgmma.
- ``"fp8_mma"``: one fp8 MMA per 32-wide MX block into a fresh fp32 partial, then
  ``acc += partial * (2^ea[:, None] * 2^eb[None, :])`` (DeepGEMM-style promotion, at
  every block). fp4 operands are widened to e4m3 in registers (exact: e2m1 is a subset).
  The scales are read transposed, ``[K // 32, rows]``, so each block's scale vector is
  one contiguous load.
- ``"dequant_bf16"``: the Triton dequantize (:mod:`mx_kernels.dequant_triton`) writes
  both operands in bf16 (exact unless a value is below 2^-133), then one bf16 GEMM with
  fp32 accumulation (:mod:`mx_kernels.bf16_mm`): cuBLAS on CUDA (``torch.mm``), an fp32
  matmul under the interpreter.
  Two extra passes over the operands, but the GEMM runs at the bf16 tensor-core rate,
  which neither fused design reaches on sm90.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from mx_kernels.backend import interpreter_enabled, persistent_programs
from mx_kernels.bf16_mm import bf16_gemm
from mx_kernels.dequant_triton import (
    dequantize_triton,
    e8m0_to_fp32,
    fp4x2_to_e4m3,
    store_rounded,
)
from mx_kernels.settings import DESIGNS

__all__ = ["DESIGNS", "TRITON_FORMATS", "autotuned_config", "configs", "scaled_mm_triton"]


TRITON_FORMATS = {
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
    torch.uint8: "e2m1",  # fp4, two per byte along K, first element in the low nibble
}
"""``tl.dot_scaled`` format name of each operand storage dtype."""

MX_BLOCK = tl.constexpr(32)


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of ``tile_id`` in grouped order: GROUP_M tile rows at a time."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile_id // num_pid_in_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % num_pid_in_group) % group_size_m
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm):
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    # Rounded on the bits even on GPUs: once per output element, not worth a variant.
    store_rounded(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc, mask, False)


@triton.jit
def mx_mm_dot_scaled_kernel(
    a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr,
    M, N, K, stride_asm, stride_bsn, stride_cm, NUM_SMS,
    A_FMT: tl.constexpr, B_FMT: tl.constexpr, A_PACK: tl.constexpr, B_PACK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """Design "dot_scaled". Scales are row-major [rows, K // 32] uint8."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            k0 = kt * BLOCK_K
            a = a_desc.load([pid_m * BLOCK_M, k0 // A_PACK])
            b = b_desc.load([pid_n * BLOCK_N, k0 // B_PACK])
            offs_s = k0 // MX_BLOCK + tl.arange(0, BLOCK_K // MX_BLOCK)
            s_ok = offs_s[None, :] < K // MX_BLOCK
            a_ptrs = a_scale_ptr + offs_m[:, None] * stride_asm + offs_s[None, :]
            b_ptrs = b_scale_ptr + offs_n[:, None] * stride_bsn + offs_s[None, :]
            # Scale byte 0 (2^-127) beyond the edges meets zero-filled data.
            sa = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & s_ok, other=0)
            sb = tl.load(b_ptrs, mask=(offs_n[:, None] < N) & s_ok, other=0)
            acc = tl.dot_scaled(a, sa, A_FMT, tl.trans(b), sb, B_FMT, acc=acc)
        _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)


@triton.jit
def mx_mm_fp8_mma_kernel(
    a_desc, b_desc, a_scale_ptr, b_scale_ptr, c_ptr,
    M, N, K, stride_ask, stride_bsk, stride_cm, NUM_SMS,
    A_PACK: tl.constexpr, B_PACK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """Design "fp8_mma". Scales are transposed: [K // 32, rows] uint8."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            # One load per 32-wide block (not one [BLOCK_K] tile sliced in registers):
            # BLOCK_K only sets how many independent MMAs each iteration offers.
            for kk in tl.static_range(BLOCK_K // MX_BLOCK):
                k = kt * BLOCK_K + kk * MX_BLOCK
                a = a_desc.load([pid_m * BLOCK_M, k // A_PACK])
                b = b_desc.load([pid_n * BLOCK_N, k // B_PACK])
                if A_PACK == 2:
                    a = fp4x2_to_e4m3(a)
                if B_PACK == 2:
                    b = fp4x2_to_e4m3(b)
                kb = k // MX_BLOCK
                # A block past K (when BLOCK_K does not divide it) reads no scales.
                m_end = tl.where(k < K, M, 0)
                n_end = tl.where(k < K, N, 0)
                sa = tl.load(a_scale_ptr + kb * stride_ask + offs_m, mask=offs_m < m_end)
                sb = tl.load(b_scale_ptr + kb * stride_bsk + offs_n, mask=offs_n < n_end)
                partial = tl.dot(a, tl.trans(b))
                # Scale product first: exact for any pair whose product is an fp32
                # (2^-127 * 2^127 = 1 included), where partial * 2^-127 would round.
                scale = e8m0_to_fp32(sa)[:, None] * e8m0_to_fp32(sb)[None, :]
                acc += partial * scale
        _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)


def _config(design: str, bm: int, bn: int, bk: int, warps: int, stages: int) -> triton.Config:
    meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    hook = functools.partial(_set_block_shapes, design=design)
    return triton.Config(meta, num_warps=warps, num_stages=stages, pre_hook=hook)


def configs(design: str) -> list[triton.Config]:
    """Autotune configs of ``design``.

    Args:
        design: one of :data:`DESIGNS`.
    Returns:
        The ``triton.Config`` list (block sizes, warps, stages; a pre-hook sizing the TMA
        boxes); a single small one under the interpreter; empty for ``"dequant_bf16"``,
        which has no GEMM kernel of its own.
    """
    if design == "dequant_bf16":
        return []  # no GEMM kernel of its own to tune
    if interpreter_enabled():
        return [_config(design, 128, 256, 256, 4, 1)]
    if design == "dot_scaled":
        # bf16 wgmma after the upcast on sm90: the big tiles of a bf16 GEMM.
        shapes = [(128, 256, 128, 8, 3), (256, 128, 128, 8, 3), (128, 128, 128, 8, 4),
                  (128, 128, 128, 4, 4), (128, 256, 64, 8, 4)]  # fmt: skip
    else:
        # acc and partial are both live fp32 tiles: BLOCK_M * BLOCK_N / threads <= 64
        # registers each keeps them out of local memory.
        shapes = [(128, 128, 128, 8, 4), (128, 128, 64, 8, 5), (64, 256, 128, 8, 4),
                  (128, 256, 128, 8, 3), (64, 128, 128, 4, 4)]  # fmt: skip
    return [_config(design, *s) for s in shapes]


def _set_block_shapes(nargs: dict, design: str) -> None:
    """Pre-hook: size the TMA boxes for this config (packed fp4 boxes are half as wide)."""
    bk = MX_BLOCK.value if design == "fp8_mma" else nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [nargs["BLOCK_M"], bk // nargs["A_PACK"]]
    nargs["b_desc"].block_shape = [nargs["BLOCK_N"], bk // nargs["B_PACK"]]


@functools.cache
def _autotuned(design: str, interpret: bool):
    kernel = mx_mm_dot_scaled_kernel if design == "dot_scaled" else mx_mm_fp8_mma_kernel
    return triton.autotune(configs=configs(design), key=["M", "N", "K"])(kernel)


def autotuned_config(design: str) -> triton.Config | None:
    """The config autotuning picked for ``design``'s last launch.

    Args:
        design: ``"dot_scaled"`` or ``"fp8_mma"``.
    Returns:
        The ``triton.Config``, or None before a launch of ``design`` in this process (and
        interpreter setting).
    """
    return getattr(_autotuned(design, interpreter_enabled()), "best_config", None)


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """Contiguous, 16-byte-aligned base (TMA's requirement; row strides are K or K / 2
    bytes, multiples of 16 since K % 32 == 0)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def scaled_mm_triton(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    design: str = "dot_scaled",
    config: triton.Config | None = None,
) -> torch.Tensor:
    """Launch one of the kernels, on operands :func:`mx_kernels.scaled_mm` has checked.

    Args:
        a_q, a_scale, b_q, b_scale: as :func:`mx_kernels.scaled_mm` (fp4 operands as
            uint8 [rows, K // 2]), scales plain [rows, K // 32], any strides.
        out_dtype: bf16, fp16 or fp32.
        design: one of :data:`DESIGNS` (module doc).
        config: a ``triton.Config`` to launch instead of autotuning (benchmarks use it).
    Returns:
        ``[M, N]`` in ``out_dtype``, contiguous.
    Raises:
        ValueError: ``design`` not one of :data:`DESIGNS`.
    """
    if design not in DESIGNS:
        raise ValueError(f"design={design!r} is not one of {', '.join(DESIGNS)}")
    if design == "dequant_bf16":
        return _dequant_bf16_mm(a_q, a_scale, b_q, b_scale, out_dtype)
    a_q, b_q = _tma_ready(a_q), _tma_ready(b_q)
    a_pack, b_pack = (2 if t.dtype == torch.uint8 else 1 for t in (a_q, b_q))
    (m, k), n = (a_q.shape[0], a_q.shape[1] * a_pack), b_q.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=a_q.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    a_scale, b_scale = a_scale.view(torch.uint8), b_scale.view(torch.uint8)
    if design == "fp8_mma":
        a_scale, b_scale = a_scale.t().contiguous(), b_scale.t().contiguous()
    else:
        a_scale, b_scale = a_scale.contiguous(), b_scale.contiguous()
    # Block shapes are placeholders until the config's pre-hook sizes them.
    a_desc = TensorDescriptor.from_tensor(a_q, [1, 16])
    b_desc = TensorDescriptor.from_tensor(b_q, [1, 16])
    cap = persistent_programs(a_q.device)
    args = dict(
        a_desc=a_desc, b_desc=b_desc, a_scale_ptr=a_scale, b_scale_ptr=b_scale, c_ptr=out,
        M=m, N=n, K=k, stride_cm=out.stride(0), NUM_SMS=cap, A_PACK=a_pack, B_PACK=b_pack,
    )  # fmt: skip
    if design == "dot_scaled":
        fmts = dict(A_FMT=TRITON_FORMATS[a_q.dtype], B_FMT=TRITON_FORMATS[b_q.dtype])
        args.update(stride_asm=a_scale.stride(0), stride_bsn=b_scale.stride(0), **fmts)
    else:
        args.update(stride_ask=a_scale.stride(0), stride_bsk=b_scale.stride(0))

    def grid(meta: dict) -> tuple[int]:
        tiles = triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])
        return (min(cap, tiles),)

    if config is None:
        _autotuned(design, interpreter_enabled())[grid](**args)
        return out
    meta = dict(config.kwargs)
    _set_block_shapes({**args, **meta}, design)
    kernel = mx_mm_dot_scaled_kernel if design == "dot_scaled" else mx_mm_fp8_mma_kernel
    kernel[grid](**args, **meta, num_warps=config.num_warps, num_stages=config.num_stages)
    return out


_DEQUANT_FORMATS = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "e2m1": "fp4_e2m1"}


def _dequant_bf16_mm(a_q, a_scale, b_q, b_scale, out_dtype: torch.dtype) -> torch.Tensor:
    """Design "dequant_bf16" (module doc)."""
    a, b = (
        dequantize_triton(
            q.view(torch.uint8), s.view(torch.uint8), _DEQUANT_FORMATS[TRITON_FORMATS[q.dtype]],
            MX_BLOCK.value, torch.bfloat16,
        )
        for q, s in ((a_q, a_scale), (b_q, b_scale))
    )  # fmt: skip
    return bf16_gemm(a, b.t(), out_dtype)
