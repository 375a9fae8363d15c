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

``scale_layout="blocked"`` (for both, or per operand as ``(a's, b's)``) takes a scale
already in cuBLAS's blocked layout: a contiguous e8m0 tensor of any shape holding
``swizzle_scales(scale)``, ``ceil128(rows) * ceil4(K // 32)`` elements (a weight's
scales swizzled once, say). cuBLAS then reads it as it is; the emulated and Triton
backends unswizzle it first (a copy per call: correct, only slower).

Backends (``backend=``; the choice is logged once at INFO, nothing falls back silently):

- ``"emulated"``: dequantize both to fp32 (mx-core), fp32 matmul, cast. The exact
  reference (with TF32 off, torch's default); the auto choice off CUDA.
- ``"cublas"``: PyTorch's cuBLAS MX GEMM (:mod:`mx_kernels.cublas`; MXFP8 through
  ``torch._scaled_mm``, MXFP4 through ``torch.nn.functional.scaled_mm``) with the
  scales in cuBLAS's blocked layout. The auto choice on sm100 and sm103 for the
  combinations PyTorch tests (e4m3 x e4m3 or fp4 x fp4, a bf16 result); which devices
  take it at all: :mod:`mx_kernels.capability`.
- ``"triton"``: :mod:`mx_kernels.matmul_triton` (sm90+, or CPU under
  ``TRITON_INTERPRET=1``). The auto choice on other CUDA devices and for the other
  combinations (logged with the reason). Its design comes from the
  ``MX_KERNELS_MM_DESIGN`` environment variable: ``dequant_bf16`` (default),
  ``dot_scaled`` or ``fp8_mma`` (:mod:`mx_kernels.matmul_triton` describes each); the
  design that ran is logged once.

The op is ``mx::scaled_mm(a_bytes, a_scale_bytes, a_fmt, b_bytes, b_scale_bytes, b_fmt,
out_dtype, backend, a_scale_layout, b_scale_layout)``: every tensor a uint8 view,
formats by mx-core name.
"""

from __future__ import annotations

import torch

from mx_core import MXTensor, get_format
from mx_kernels.backend import log_choice, resolve_matmul_backend
from mx_kernels.bf16_mm import bf16_gemm
from mx_kernels.cublas import (
    CublasArgs,
    cublas_unsupported_reason,
    prepare_cublas_args,
    scaled_mm_cublas,
)
from mx_kernels.library import define_op
from mx_kernels.matmul_args import (
    EXPECTED_DTYPES,
    FORMATS_BY_DTYPE,
    MX_BLOCK,
    OUT_DTYPES,
    check_scaled_mm_args,
    scale_layouts,
)
from mx_kernels.settings import DEFAULT_DESIGN, DESIGNS, mm_design
from mx_kernels.swizzle import unswizzle_scales

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
    "scaled_mm_backend",
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
    scale_layout: str | tuple[str, str] = "plain",
) -> torch.Tensor:
    """MX matmul ``a @ b^T`` of two K-major MX operands (layouts in the module doc).

    Args:
        a_q: [M, K] fp8 codes (or [M, K // 2] packed fp4), row-major.
        a_scale: [M, K // 32] E8M0 scales of ``a_q``, unswizzled (or blocked: see
            ``scale_layout``).
        b_q: [N, K] fp8 codes (or [N, K // 2] packed fp4), row-major.
        b_scale: [N, K // 32] E8M0 scales of ``b_q``, likewise.
        out_dtype: bf16, fp16 or fp32.
        backend: ``"auto"``, ``"emulated"``, ``"cublas"`` or ``"triton"``.
        scale_layout: ``"plain"`` or ``"blocked"`` (module doc), for both scales or as
            a pair ``(a_scale's, b_scale's)``.
    Returns:
        [M, N] in ``out_dtype``.
    Raises:
        TypeError: an operand is not a tensor or has the wrong dtype.
        ValueError: bad shapes or layout, a blocked scale of the wrong size or not
            contiguous, unsupported ``out_dtype``, unknown backend, or
            ``backend="cublas"`` with a combination cuBLAS does not take (the message
            names the operand or the combination).
        RuntimeError: the backend cannot run on this device (for ``"cublas"``: the
            capability, the torch API or the build feature missing).

    Example:
        >>> a, w = mx_core.quantize(x, "fp8_e4m3"), mx_core.quantize(weight, "fp8_e4m3")
        >>> y = scaled_mm(a.qdata, a.scale, w.qdata, w.scale)  # x @ weight.T, bf16
    """
    a_layout, b_layout = scale_layouts(scale_layout)
    if not torch.compiler.is_compiling():  # the op body checks again (see _scaled_mm_impl)
        check_scaled_mm_args(
            a_q, a_scale, b_q, b_scale, out_dtype=out_dtype, backend=backend,
            a_scale_layout=a_layout, b_scale_layout=b_layout,
        )  # fmt: skip
    elif a_q.dtype not in FORMATS_BY_DTYPE or b_q.dtype not in FORMATS_BY_DTYPE:
        raise TypeError(f"scaled_mm: a_q and b_q must have dtypes {EXPECTED_DTYPES}")
    # The op takes uint8 views plus format names: opcheck compares inputs with allclose,
    # which CPU float8 lacks, and gloo refuses float8; the views cost nothing.
    a_fmt, b_fmt = FORMATS_BY_DTYPE[a_q.dtype], FORMATS_BY_DTYPE[b_q.dtype]
    u8 = torch.uint8
    return SCALED_MM(
        a_q.view(u8), a_scale.view(u8), a_fmt, b_q.view(u8), b_scale.view(u8), b_fmt,
        out_dtype, backend, a_layout, b_layout,
    )  # fmt: skip


def scaled_mm_backend(
    device: torch.device,
    a_fmt: str,
    b_fmt: str,
    *,
    backend: str = "auto",
    out_dtype: torch.dtype = torch.bfloat16,
    n: int = 16,
) -> str | None:
    """The backend :func:`scaled_mm` would run for these operands (asked without logging;
    nothing runs), so a caller can prepare what that backend reads: cuBLAS reads scales
    in the blocked layout, which the casts can write directly.

    Args:
        device: where the GEMM runs.
        a_fmt, b_fmt: the operands' formats, mx-core names.
        backend: as :func:`scaled_mm`'s.
        out_dtype: the result's dtype.
        n: b's rows, N (cuBLAS needs N % 16 == 0).
    Returns:
        ``"emulated"``, ``"cublas"`` or ``"triton"``; None for an fp6 operand, which has no
        MX GEMM.
    Raises:
        ValueError: as :func:`scaled_mm` for ``backend``.
        RuntimeError: as :func:`scaled_mm`, where ``backend`` cannot run on ``device``.
    """
    formats = [get_format(f) for f in (a_fmt, b_fmt)]
    if any(f.bits == 6 for f in formats):
        return None
    dtypes = [torch.uint8 if f.is_packed else f.storage_dtype for f in formats]
    reason = cublas_unsupported_reason(*dtypes, n, out_dtype)
    fp4 = formats[0].is_packed and formats[1].is_packed
    return resolve_matmul_backend(
        "scaled_mm", backend, device, cublas_unsupported=reason, fp4=fp4, log=False
    )


def bf16_gemm_design(
    device: torch.device,
    a_fmt: str,
    b_fmt: str,
    *,
    backend: str = "auto",
    out_dtype: torch.dtype = torch.bfloat16,
) -> bool:
    """Whether :func:`scaled_mm` with ``backend`` on ``device`` multiplies its operands
    as bf16 after dequantizing them (the ``dequant_bf16`` design, sm90's choice), for an
    ``out_dtype`` result.

    Callers that hold the high-precision tensors can then fuse cast and dequantize
    (:mod:`mx_kernels.fake_quant`) and run the same bf16 GEMM, with the same result.
    Asks without logging.

    Arguments as :func:`scaled_mm_backend` (N a multiple of 16).

    Returns:
        True where the ``dequant_bf16`` design would run.
    """
    chosen = scaled_mm_backend(device, a_fmt, b_fmt, backend=backend, out_dtype=out_dtype)
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
    a_scale_layout: str = "plain",
    b_scale_layout: str = "plain",
) -> torch.Tensor:
    """The op behind :func:`scaled_mm`: checked arguments as uint8 views, element
    formats by name (``fp8_e4m3``, ``fp8_e5m2``, ``fp4_e2m1``), scale layouts by name
    (``plain``, ``blocked``)."""
    a_q, b_q = _STORAGE[a_fmt](a_bytes), _STORAGE[b_fmt](b_bytes)
    a_scale = a_scale_bytes.view(torch.float8_e8m0fnu)
    b_scale = b_scale_bytes.view(torch.float8_e8m0fnu)
    # Checked here too: under torch.compile the wrapper skips its shape checks, since
    # branching on dynamic sizes there leaves SymInts among an autograd.Function's
    # outputs, which torch 2.11's dynamo asserts on (overwrite_tensor_vt_proxy).
    layouts = {"a_scale_layout": a_scale_layout, "b_scale_layout": b_scale_layout}
    _, n, k = check_scaled_mm_args(
        a_q, a_scale, b_q, b_scale, out_dtype=out_dtype, backend=backend, **layouts
    )
    reason = cublas_unsupported_reason(a_q.dtype, b_q.dtype, n, out_dtype)
    fp4 = a_fmt == b_fmt == "fp4_e2m1"
    chosen = resolve_matmul_backend(
        "scaled_mm", backend, a_q.device, cublas_unsupported=reason, fp4=fp4
    )
    if chosen == "cublas":
        return scaled_mm_cublas(a_q, a_scale, b_q, b_scale, out_dtype, **layouts)
    # Only cuBLAS reads blocked scales: the other backends get them unswizzled (a copy).
    if a_scale_layout == "blocked":
        a_scale = unswizzle_scales(a_scale, (a_q.shape[0], k // MX_BLOCK))
    if b_scale_layout == "blocked":
        b_scale = unswizzle_scales(b_scale, (n, k // MX_BLOCK))
    if chosen == "emulated":
        return scaled_mm_reference(a_q, a_scale, b_q, b_scale, out_dtype)
    from mx_kernels.matmul_triton import scaled_mm_triton  # imports triton: only when used

    try:
        design = mm_design()
    except ValueError as e:
        raise ValueError(f"scaled_mm: {e}") from None
    log_choice("scaled_mm", f"triton design {design}", a_q.device.type, _DESIGN_WHY[design])
    return scaled_mm_triton(a_q, a_scale, b_q, b_scale, out_dtype, design=design)


def _scaled_mm_fake(
    a_bytes, a_scale_bytes, a_fmt, b_bytes, b_scale_bytes, b_fmt, out_dtype, backend,
    a_scale_layout="plain", b_scale_layout="plain",
):  # fmt: skip
    return a_bytes.new_empty((a_bytes.shape[0], b_bytes.shape[0]), dtype=out_dtype)


SCALED_MM = define_op(
    "scaled_mm(Tensor a_bytes, Tensor a_scale_bytes, str a_fmt, Tensor b_bytes, "
    "Tensor b_scale_bytes, str b_fmt, ScalarType out_dtype, str backend, "
    "str a_scale_layout='plain', str b_scale_layout='plain') -> Tensor",
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
    cast to ``out_dtype``. Arguments as :func:`scaled_mm`, unchecked, scales plain.

    Returns:
        [M, N] ``a @ b^T`` in ``out_dtype``, rounded once from the fp32 product (exact with
        TF32 off).
    """
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
