"""Argument checks of :func:`mx_kernels.scaled_mm` (and of its op's body, which checks
again under torch.compile): operand dtypes and layouts, scale shapes, output dtype,
backend. Layouts in :mod:`mx_kernels.matmul`."""

from __future__ import annotations

import torch

from mx_kernels.backend import MATMUL_BACKENDS
from mx_kernels.swizzle import swizzled_shape

__all__ = [
    "EXPECTED_DTYPES",
    "FORMATS_BY_DTYPE",
    "MX_BLOCK",
    "OUT_DTYPES",
    "SCALE_LAYOUTS",
    "check_scaled_mm_args",
    "scale_layouts",
]

MX_BLOCK = 32
"""Elements per scale along K (the block size MX GEMMs take)."""
OUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
"""Output dtypes of :func:`scaled_mm`."""

FORMATS_BY_DTYPE: dict[torch.dtype, str] = {
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
    torch.uint8: "fp4_e2m1",
    torch.float4_e2m1fn_x2: "fp4_e2m1",
}
EXPECTED_DTYPES = (
    "float8_e4m3fn, float8_e5m2, or fp4_e2m1 packed two per byte (uint8 or float4_e2m1fn_x2)"
)
"""What the operands' dtypes may be, for error messages."""
SCALE_LAYOUTS: tuple[str, ...] = ("plain", "blocked")
"""Layouts of :func:`scaled_mm`'s scales: ``"plain"``, [rows, K // 32] with any strides;
``"blocked"``, a contiguous e8m0 tensor of any shape whose memory holds
``swizzle_scales(scale)`` (``ceil128(rows) * ceil4(K // 32)`` elements), cuBLAS's order."""


def scale_layouts(scale_layout: object) -> tuple[str, str]:
    """Both layouts of :func:`scaled_mm`'s ``scale_layout``.

    Args:
        scale_layout: one layout for both scales, or a pair ``(a_scale's, b_scale's)``.
    Returns:
        ``(a_scale's, b_scale's)``.
    Raises:
        TypeError: not a str or a pair of str.
        ValueError: a layout not in :data:`SCALE_LAYOUTS`.
    """
    pair = (scale_layout, scale_layout) if isinstance(scale_layout, str) else scale_layout
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(
            f"scaled_mm: scale_layout must be a str or a pair (a's, b's) of str, got "
            f"{scale_layout!r}"
        )
    for name, layout in zip(("a", "b"), pair, strict=True):
        if not isinstance(layout, str):
            raise TypeError(f"scaled_mm: scale_layout of {name} must be a str, got {layout!r}")
        if layout not in SCALE_LAYOUTS:
            raise ValueError(
                f"scaled_mm: scale_layout={scale_layout!r}: {layout!r} (of {name}) is not "
                f"one of {', '.join(SCALE_LAYOUTS)}"
            )
    return pair[0], pair[1]


def check_scaled_mm_args(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype,
    backend: str,
    a_scale_layout: str = "plain",
    b_scale_layout: str = "plain",
) -> tuple[int, int, int]:
    """Validate :func:`scaled_mm`'s arguments. Arguments as :func:`scaled_mm`, with the
    scales' layouts (:data:`SCALE_LAYOUTS`) one keyword each.

    Returns:
        The logical ``(M, N, K)``.
    Raises:
        TypeError, ValueError: as :func:`scaled_mm`.
    """
    k_a = _check_operand("a_q", a_q)
    k_b = _check_operand("b_q", b_q)
    for layout in (a_scale_layout, b_scale_layout):
        if layout not in SCALE_LAYOUTS:
            raise ValueError(f"scaled_mm: scale layout {layout!r} is not one of {SCALE_LAYOUTS}")
    if a_scale_layout == "plain":
        _refuse_fp6("a_q", a_q, "a_scale", a_scale)
    if b_scale_layout == "plain":
        _refuse_fp6("b_q", b_q, "b_scale", b_scale)
    if k_a != k_b:
        raise ValueError(
            f"scaled_mm: a_q [M, K] has K={k_a} but b_q [N, K] has K={k_b}; both must be "
            "K-major with the same K (pass the weight as [N, K], not transposed)"
        )
    if k_a % MX_BLOCK:
        raise ValueError(f"scaled_mm: K={k_a} (of a_q and b_q) is not a multiple of 32")
    m, n = a_q.shape[0], b_q.shape[0]
    _check_scale("a_scale", a_scale, (m, k_a // MX_BLOCK), "M", a_scale_layout)
    _check_scale("b_scale", b_scale, (n, k_a // MX_BLOCK), "N", b_scale_layout)
    for name, t in (("a_scale", a_scale), ("b_q", b_q), ("b_scale", b_scale)):
        if t.device != a_q.device:
            raise ValueError(f"scaled_mm: {name} is on {t.device} but a_q is on {a_q.device}")
    if not isinstance(out_dtype, torch.dtype):
        raise TypeError(
            f"scaled_mm: out_dtype must be a torch.dtype, got {type(out_dtype).__name__}"
        )
    if out_dtype not in OUT_DTYPES:
        allowed = ", ".join(str(d) for d in OUT_DTYPES)
        raise ValueError(f"scaled_mm: out_dtype={out_dtype} is not supported; allowed: {allowed}")
    if not isinstance(backend, str):
        raise TypeError(f"scaled_mm: backend must be a str, got {type(backend).__name__}")
    if backend not in MATMUL_BACKENDS:
        raise ValueError(
            f"scaled_mm: backend={backend!r} is not one of {', '.join(MATMUL_BACKENDS)}"
        )
    return m, n, k_a


def _check_operand(name: str, q: torch.Tensor) -> int:
    """Check one element operand; return its logical K."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"scaled_mm: {name} must be a torch.Tensor, got {type(q).__name__}")
    if q.dtype not in FORMATS_BY_DTYPE:
        raise TypeError(f"scaled_mm: {name} has dtype {q.dtype}; expected {EXPECTED_DTYPES}")
    if q.dim() != 2:
        raise ValueError(f"scaled_mm: {name} must be 2-D [rows, K], got shape {tuple(q.shape)}")
    if q.stride(1) != 1:
        raise ValueError(
            f"scaled_mm: {name} must be K-major (row-major [rows, K], stride(1) == 1, as "
            f"nn.Linear holds its weight), got shape {tuple(q.shape)} with strides "
            f"{q.stride()}; a transposed view is not K-major"
        )
    return q.shape[1] * (2 if FORMATS_BY_DTYPE[q.dtype] == "fp4_e2m1" else 1)


def _check_scale(
    name: str, scale: torch.Tensor, shape: tuple[int, int], rows: str, layout: str
) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scaled_mm: {name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != torch.float8_e8m0fnu:
        raise TypeError(f"scaled_mm: {name} has dtype {scale.dtype}; expected torch.float8_e8m0fnu")
    if layout == "blocked":
        rp, cp = swizzled_shape(*shape)
        if scale.numel() != rp * cp:
            raise ValueError(
                f"scaled_mm: {name} (blocked layout) has {scale.numel()} elements; expected "
                f"{rp * cp} = ceil128({rows}={shape[0]}) * ceil4(K // 32={shape[1]}), what "
                f"swizzle_scales of the [{rows}, K // 32] scales holds"
            )
        if not scale.is_contiguous():
            raise ValueError(
                f"scaled_mm: {name} (blocked layout) must be contiguous (its memory order is "
                f"the layout), got shape {tuple(scale.shape)} with strides {scale.stride()}"
            )
        return
    if tuple(scale.shape) != shape:
        raise ValueError(
            f"scaled_mm: {name} has shape {tuple(scale.shape)}; expected {shape} = "
            f"[{rows}, K // 32] (unswizzled, one scale per 32 elements along K)"
        )


def _refuse_fp6(name: str, q: torch.Tensor, scale_name: str, scale) -> None:
    """uint8 codes [rows, K] with scales [rows, K // 32] are fp6 codes, one per byte, as
    mx_core.quantize stores them (packed fp4 would be [rows, K // 2] with the same
    scales): name the format, rather than read them as fp4 and report a scale shape."""
    if q.dtype != torch.uint8 or not isinstance(scale, torch.Tensor) or q.shape[1] == 0:
        return
    if q.shape[1] % MX_BLOCK == 0 and tuple(scale.shape) == (q.shape[0], q.shape[1] // MX_BLOCK):
        raise ValueError(
            f"scaled_mm: {name} (uint8 {tuple(q.shape)}) with {scale_name} "
            f"{tuple(scale.shape)} holds one code per element: fp6 codes (fp6_e2m3, "
            "fp6_e3m2), which have no MX GEMM. scaled_mm takes fp8_e4m3, fp8_e5m2 and "
            "fp4_e2m1 (packed two per byte, [rows, K // 2]); dequantize fp6 operands "
            "(mx_kernels.dequantize_rowwise) and multiply those instead"
        )
