"""MX scaled matmul ``scaled_mm(a_q, a_scale, b_q, b_scale) = a @ b^T``: the ``mx::scaled_mm`` op.

Layouts (both operands K-major, as ``nn.Linear`` holds its weight)::

    a_q     [M, K]        float8_e4m3fn | float8_e5m2     (fp4: [M, K // 2] packed bytes)
    a_scale [M, K // 32]  float8_e8m0fnu, unswizzled, any strides
    b_q     [N, K]        likewise                        (fp4: [N, K // 2])
    b_scale [N, K // 32]
    out     [M, N]        bf16 | fp16 | fp32

This is what ``mx_core.quantize(x, fmt, dim=-1)`` returns for ``x`` [M, K] and
``w`` [N, K]. fp4_e2m1 is two elements per byte along K, the first in the low nibble, as
uint8 or ``torch.float4_e2m1fn_x2``; the formats of ``a`` and ``b`` may differ.

Backends (``backend=``; the choice is logged once at INFO, nothing falls back silently):

- ``"emulated"``: dequantize both to fp32 (mx-core), fp32 matmul, cast. The exact
  reference (with TF32 off, torch's default); the auto choice off CUDA.
- ``"cublas"``: ``torch._scaled_mm`` with the scales in cuBLAS's blocked layout
  (sm100+ only). The auto choice on sm100+ where cuBLAS takes the inputs.
- ``"triton"``: :mod:`mx_kernels.matmul_triton` (sm90+, or CPU under
  ``TRITON_INTERPRET=1``). The auto choice on sm90. Its design comes from the
  ``MX_KERNELS_MM_DESIGN`` environment variable: ``dequant_bf16`` (default),
  ``dot_scaled`` or ``fp8_mma`` (:mod:`mx_kernels.matmul_triton` describes each); the
  design that ran is logged once.

The op is ``mx::scaled_mm(a_bytes, a_scale_bytes, a_fmt, b_bytes, b_scale_bytes, b_fmt,
out_dtype, backend)``: every tensor a uint8 view, formats by mx-core name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mx_core import MXTensor, get_format
from mx_kernels.backend import log_choice, resolve_matmul_backend
from mx_kernels.bf16_mm import bf16_gemm
from mx_kernels.library import define_op
from mx_kernels.matmul_args import (
    EXPECTED_DTYPES,
    FORMATS_BY_DTYPE,
    MX_BLOCK,
    OUT_DTYPES,
    check_scaled_mm_args,
)
from mx_kernels.settings import DEFAULT_DESIGN, DESIGNS, mm_design
from mx_kernels.swizzle import swizzle_scales

__all__ = [
    "DEFAULT_DESIGN",
    "DESIGNS",
    "bf16_gemm",
    "bf16_gemm_design",
    "OUT_DTYPES",
    "CublasArgs",
    "check_scaled_mm_args",
    "cublas_unsupported_reason",
    "prepare_cublas_args",
    "scaled_mm",
    "scaled_mm_cublas",
    "scaled_mm_reference",
]

_DESIGN_WHY = {
    "dot_scaled": "tl.dot_scaled kernel",
    "fp8_mma": "fp8 MMA per 32-K block + fp32 rescale kernel",
    "dequant_bf16": "Triton dequantize to bf16, then a bf16 GEMM (cuBLAS on CUDA)",
}


def scaled_mm(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    backend: str = "auto",
) -> torch.Tensor:
    """MX matmul ``a @ b^T`` of two K-major MX operands (layouts in the module doc).

    Args:
        a_q: [M, K] fp8 codes (or [M, K // 2] packed fp4), row-major.
        a_scale: [M, K // 32] E8M0 scales of ``a_q``, unswizzled.
        b_q: [N, K] fp8 codes (or [N, K // 2] packed fp4), row-major.
        b_scale: [N, K // 32] E8M0 scales of ``b_q``, unswizzled.
        out_dtype: bf16, fp16 or fp32.
        backend: ``"auto"``, ``"emulated"``, ``"cublas"`` or ``"triton"``.
    Returns:
        [M, N] in ``out_dtype``.
    Raises:
        TypeError: an operand is not a tensor or has the wrong dtype.
        ValueError: bad shapes or layout, unsupported ``out_dtype``, unknown backend
            (the message names the operand).
        RuntimeError: the backend cannot run on this device.

    Example:
        >>> a, w = mx_core.quantize(x, "fp8_e4m3"), mx_core.quantize(weight, "fp8_e4m3")
        >>> y = scaled_mm(a.qdata, a.scale, w.qdata, w.scale)  # x @ weight.T, bf16
    """
    if not torch.compiler.is_compiling():  # the op body checks again (see _scaled_mm_op)
        check_scaled_mm_args(a_q, a_scale, b_q, b_scale, out_dtype=out_dtype, backend=backend)
    elif a_q.dtype not in FORMATS_BY_DTYPE or b_q.dtype not in FORMATS_BY_DTYPE:
        raise TypeError(f"scaled_mm: a_q and b_q must have dtypes {EXPECTED_DTYPES}")
    # The op takes uint8 views plus format names: opcheck compares inputs with allclose,
    # which CPU float8 lacks, and gloo refuses float8; the views cost nothing.
    a_fmt, b_fmt = FORMATS_BY_DTYPE[a_q.dtype], FORMATS_BY_DTYPE[b_q.dtype]
    u8 = torch.uint8
    return SCALED_MM(
        a_q.view(u8), a_scale.view(u8), a_fmt, b_q.view(u8), b_scale.view(u8), b_fmt,
        out_dtype, backend,
    )  # fmt: skip


def bf16_gemm_design(
    device: torch.device, a_fmt: str, b_fmt: str, *, backend: str = "auto"
) -> bool:
    """Whether :func:`scaled_mm` with ``backend`` on ``device`` multiplies its operands
    as bf16 after dequantizing them (the ``dequant_bf16`` design, sm90's choice).

    Callers that hold the high-precision tensors can then fuse cast and dequantize
    (:mod:`mx_kernels.fake_quant`) and run the same bf16 GEMM, with the same result.
    Asks without logging; formats are mx-core names.
    """
    formats = [get_format(f) for f in (a_fmt, b_fmt)]
    if any(f.bits == 6 for f in formats):
        return False  # fp6 has no MX GEMM at all
    dtypes = [torch.uint8 if f.is_packed else f.storage_dtype for f in formats]
    reason = cublas_unsupported_reason(*dtypes, 16)
    chosen = resolve_matmul_backend(
        "scaled_mm", backend, device, cublas_unsupported=reason, log=False
    )
    return chosen == "triton" and mm_design() == "dequant_bf16"


def _scaled_mm_impl(
    a_bytes: torch.Tensor,
    a_scale_bytes: torch.Tensor,
    a_fmt: str,
    b_bytes: torch.Tensor,
    b_scale_bytes: torch.Tensor,
    b_fmt: str,
    out_dtype: torch.dtype,
    backend: str,
) -> torch.Tensor:
    """The op behind :func:`scaled_mm`: checked arguments as uint8 views, element
    formats by name (``fp8_e4m3``, ``fp8_e5m2``, ``fp4_e2m1``)."""
    a_q, b_q = _STORAGE[a_fmt](a_bytes), _STORAGE[b_fmt](b_bytes)
    a_scale = a_scale_bytes.view(torch.float8_e8m0fnu)
    b_scale = b_scale_bytes.view(torch.float8_e8m0fnu)
    # Checked here too: under torch.compile the wrapper skips its shape checks, since
    # branching on dynamic sizes there leaves SymInts among an autograd.Function's
    # outputs, which torch 2.11's dynamo asserts on (overwrite_tensor_vt_proxy).
    check_scaled_mm_args(a_q, a_scale, b_q, b_scale, out_dtype=out_dtype, backend=backend)
    reason = cublas_unsupported_reason(a_q.dtype, b_q.dtype, b_q.shape[0])
    chosen = resolve_matmul_backend("scaled_mm", backend, a_q.device, cublas_unsupported=reason)
    if chosen == "emulated":
        return scaled_mm_reference(a_q, a_scale, b_q, b_scale, out_dtype)
    if chosen == "cublas":
        return scaled_mm_cublas(a_q, a_scale, b_q, b_scale, out_dtype)
    from mx_kernels.matmul_triton import scaled_mm_triton  # imports triton: only when used

    try:
        design = mm_design()
    except ValueError as e:
        raise ValueError(f"scaled_mm: {e}") from None
    log_choice("scaled_mm", f"triton design {design}", a_q.device.type, _DESIGN_WHY[design])
    return scaled_mm_triton(a_q, a_scale, b_q, b_scale, out_dtype, design=design)


def _scaled_mm_fake(
    a_bytes, a_scale_bytes, a_fmt, b_bytes, b_scale_bytes, b_fmt, out_dtype, backend
):
    return a_bytes.new_empty((a_bytes.shape[0], b_bytes.shape[0]), dtype=out_dtype)


SCALED_MM = define_op(
    "scaled_mm(Tensor a_bytes, Tensor a_scale_bytes, str a_fmt, Tensor b_bytes, "
    "Tensor b_scale_bytes, str b_fmt, ScalarType out_dtype, str backend) -> Tensor",
    _scaled_mm_impl,
    _scaled_mm_fake,
)


_STORAGE = {
    "fp8_e4m3": lambda t: t.view(torch.float8_e4m3fn),
    "fp8_e5m2": lambda t: t.view(torch.float8_e5m2),
    "fp4_e2m1": lambda t: t,  # packed bytes
}


def scaled_mm_reference(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The "emulated" backend: fp32 dequantize (``MXTensor.dequantize``), fp32 matmul,
    cast to ``out_dtype``. Arguments as :func:`scaled_mm`, unchecked."""
    a_hp = _dequantize(a_q, a_scale)
    b_hp = _dequantize(b_q, b_scale)
    return (a_hp @ b_hp.t()).to(out_dtype)


def _dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    fmt = FORMATS_BY_DTYPE[q.dtype]
    qdata = q.view(torch.uint8) if fmt == "fp4_e2m1" else q
    t = MXTensor(
        qdata=qdata, scale=scale, fmt=fmt, block_size=MX_BLOCK, dim=1, orig_dtype=torch.float32
    )
    return t.dequantize(torch.float32)


@dataclass(frozen=True)
class CublasArgs:
    """Operands of ``torch._scaled_mm`` for an MX (BlockWise1x32) GEMM on sm100.

    Requirements, from PyTorch's ``aten/src/ATen/native/cuda/ScaledBlas.cpp``
    (``is_blockwise_1x32_scaling``, ``_scaled_mm_out_cuda``, ``_scaled_gemm``):
    mat_a row-major and mat_b column-major; K % 16 == 0 and N % 16 == 0; float8 or
    ``float4_e2m1fn_x2`` data (not both e5m2); e8m0 scales, contiguous, with
    ``ceil128(rows) * ceil4(K // 32)`` elements each in the blocked 32_4_4 layout
    (https://docs.nvidia.com/cuda/cublas/#d-block-scaling-factors-layout).
    """

    mat_a: torch.Tensor
    """[M, K] row-major (fp4: [M, K // 2] ``float4_e2m1fn_x2``)."""
    mat_b: torch.Tensor
    """[K, N] column-major: ``b_q.t()`` (fp4: [K // 2, N])."""
    scale_a: torch.Tensor
    """1-D ``float8_e8m0fnu``, :func:`swizzle_scales` of a_scale flattened."""
    scale_b: torch.Tensor
    """1-D ``float8_e8m0fnu``, :func:`swizzle_scales` of b_scale flattened."""


def cublas_unsupported_reason(a_dtype: torch.dtype, b_dtype: torch.dtype, n: int) -> str | None:
    """Why cuBLAS cannot take operands of these storage dtypes and N (None if it can)."""
    a_fp4, b_fp4 = (FORMATS_BY_DTYPE.get(d) == "fp4_e2m1" for d in (a_dtype, b_dtype))
    if a_fp4 != b_fp4:
        return "a_q and b_q mix fp4 and fp8, which cuBLAS MX GEMMs do not take"
    if a_dtype == b_dtype == torch.float8_e5m2:
        return "a_q and b_q are both float8_e5m2, which cuBLAS does not multiply"
    if n % 16:
        return f"b_q has N={n} rows; cuBLAS needs N % 16 == 0"
    return None


def prepare_cublas_args(
    a_q: torch.Tensor, a_scale: torch.Tensor, b_q: torch.Tensor, b_scale: torch.Tensor
) -> CublasArgs:
    """Host-side preparation of the cuBLAS MX GEMM (pure torch, runs on any device).

    Raises:
        ValueError: cuBLAS cannot take these operands (see :func:`cublas_unsupported_reason`).
    """
    reason = cublas_unsupported_reason(a_q.dtype, b_q.dtype, b_q.shape[0])
    if reason is not None:
        raise ValueError(f"scaled_mm(backend='cublas'): {reason}")
    mat_a, mat_b = a_q.contiguous(), b_q.contiguous()
    if FORMATS_BY_DTYPE[a_q.dtype] == "fp4_e2m1":
        mat_a, mat_b = mat_a.view(torch.float4_e2m1fn_x2), mat_b.view(torch.float4_e2m1fn_x2)
    return CublasArgs(
        mat_a=mat_a,
        mat_b=mat_b.t(),
        scale_a=swizzle_scales(a_scale).flatten(),
        scale_b=swizzle_scales(b_scale).flatten(),
    )


def scaled_mm_cublas(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The "cublas" backend: ``torch._scaled_mm`` on :func:`prepare_cublas_args`.

    Raises:
        RuntimeError: not a CUDA device of compute capability >= 10.0.
    """
    device = a_q.device
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (10, 0):
        raise RuntimeError(
            "scaled_mm: the cuBLAS MX GEMM needs a CUDA device of compute capability >= 10.0"
        )
    args = prepare_cublas_args(a_q, a_scale, b_q, b_scale)
    return torch._scaled_mm(args.mat_a, args.mat_b, args.scale_a, args.scale_b, out_dtype=out_dtype)
