"""MX dequantize as a ``torch.library`` op: ``mx::dequantize_rowwise``.

The inverse of :func:`mx_kernels.quantize_rowwise`: codes [..., K] (fp4: [..., K // 2])
and E8M0 scales [..., K // block_size] back to [..., K] values in bf16, fp16 or fp32.
Each value ``code * 2^(scale - 127)`` is computed exactly in fp32 and rounded once to
the output dtype (so bf16 and fp32 outputs are exact for fp8 and fp4 codes unless a
value falls below bf16's smallest subnormal, 2^-133). A NaN scale (byte 255) decodes its
block to NaN. Triton runs fp8 and fp4 for power-of-two block sizes up to 128; fp6 and
other block sizes run mx-core's reference (logged; ``backend="triton"`` raises).
"""

from __future__ import annotations

import torch

from mx_core import MXTensor, get_format
from mx_core.args import check_int
from mx_kernels.backend import BACKENDS, TRITON_BLOCK_SIZES, resolve_backend_for
from mx_kernels.library import define_op

__all__ = ["DEQUANT_DTYPES", "dequantize_rowwise"]

DEQUANT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
"""Output dtypes of :func:`dequantize_rowwise`."""

_TRITON_FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1")


def dequantize_rowwise(
    qdata: torch.Tensor,
    scale: torch.Tensor,
    fmt: str = "fp8_e4m3",
    *,
    block_size: int = 32,
    out_dtype: torch.dtype = torch.bfloat16,
    backend: str = "auto",
) -> torch.Tensor:
    """Decode a rowwise MX cast (blocks along the last dim).

    Args:
        qdata: [..., K] codes (float8 for fp8; uint8 for fp6; fp4: [..., K // 2] uint8 or
            ``float4_e2m1fn_x2``, two codes per byte, low nibble first).
        scale: [..., K // block_size] ``float8_e8m0fnu``.
        fmt, block_size: as :func:`mx_core.quantize`.
        out_dtype: bf16, fp16 or fp32.
        backend: ``"auto"``, ``"triton"`` or ``"reference"`` (see :mod:`mx_kernels.backend`).
    Returns:
        [..., K] in ``out_dtype``, contiguous; equal to ``MXTensor(...).dequantize(out_dtype)``.
    Raises:
        TypeError: qdata or scale not a tensor, block_size not an int (a bool included).
        ValueError: shapes, dtypes, ``out_dtype`` or ``backend`` not as above (the message
            names the argument).
    """
    name = get_format(fmt).name
    _check(qdata, scale, name, block_size, out_dtype, backend)
    return DEQUANTIZE_ROWWISE(
        qdata.view(torch.uint8), scale.view(torch.uint8), name, block_size, out_dtype, backend
    )


def _check(qdata, scale, fmt: str, block_size: int, out_dtype, backend) -> None:
    fn = "dequantize_rowwise"
    for arg, t in (("qdata", qdata), ("scale", scale)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if scale.dtype != torch.float8_e8m0fnu:
        raise ValueError(f"{fn}: scale has dtype {scale.dtype}; expected torch.float8_e8m0fnu")
    if qdata.dim() == 0:
        raise ValueError(f"{fn}: qdata must have at least one dim, got a scalar")
    check_int(fn, "block_size", block_size, minimum=1)  # a bool is refused, not taken as 1
    if block_size % 2:
        raise ValueError(f"{fn}: block_size={block_size} must be a positive multiple of 2")
    packed = get_format(fmt).is_packed
    k = qdata.shape[-1] * (2 if packed else 1)
    want = (*qdata.shape[:-1], k // block_size)
    if k % block_size or tuple(scale.shape) != want:
        raise ValueError(
            f"{fn}: scale has shape {tuple(scale.shape)} but qdata {tuple(qdata.shape)} "
            f"({fmt}, K={k}) with block_size={block_size} needs {want}"
        )
    if qdata.element_size() != 1:
        raise ValueError(f"{fn}: qdata has dtype {qdata.dtype}; expected one-byte codes")
    if scale.device != qdata.device:
        raise ValueError(f"{fn}: scale is on {scale.device} but qdata is on {qdata.device}")
    if out_dtype not in DEQUANT_DTYPES:
        allowed = ", ".join(str(d) for d in DEQUANT_DTYPES)
        raise ValueError(f"{fn}: out_dtype={out_dtype} is not supported; allowed: {allowed}")
    if backend not in BACKENDS:
        raise ValueError(f"{fn}: backend={backend!r} is not one of {', '.join(BACKENDS)}")


def _triton_gap(fmt: str, block_size: int) -> str | None:
    if fmt not in _TRITON_FORMATS:
        return f"{fmt} has no Triton dequantize (Triton: {', '.join(_TRITON_FORMATS)})"
    if block_size not in TRITON_BLOCK_SIZES:
        return f"block_size={block_size} has no Triton dequantize"
    return None


def _dequantize_rowwise_impl(
    q_bytes: torch.Tensor,
    scale_bytes: torch.Tensor,
    fmt: str,
    block_size: int,
    out_dtype: torch.dtype,
    backend: str,
) -> torch.Tensor:
    gap = _triton_gap(fmt, block_size)
    if resolve_backend_for("dequantize_rowwise", backend, q_bytes.device, gap) == "reference":
        qdata = (
            q_bytes
            if fmt not in ("fp8_e4m3", "fp8_e5m2")
            else q_bytes.view(get_format(fmt).storage_dtype)
        )
        t = MXTensor(
            qdata=qdata, scale=scale_bytes.view(torch.float8_e8m0fnu), fmt=fmt,
            block_size=block_size, dim=q_bytes.dim() - 1, orig_dtype=out_dtype,
        )  # fmt: skip
        return t.dequantize(out_dtype).contiguous()
    from mx_kernels.dequant_triton import dequantize_triton  # imports triton: only when used

    return dequantize_triton(q_bytes, scale_bytes, fmt, block_size, out_dtype)


def _dequantize_rowwise_fake(q_bytes, scale_bytes, fmt, block_size, out_dtype, backend):
    k = scale_bytes.shape[-1] * block_size
    return q_bytes.new_empty((*q_bytes.shape[:-1], k), dtype=out_dtype)


DEQUANTIZE_ROWWISE = define_op(
    "dequantize_rowwise(Tensor q_bytes, Tensor scale_bytes, str fmt, SymInt block_size, "
    "ScalarType out_dtype, str backend) -> Tensor",
    _dequantize_rowwise_impl,
    _dequantize_rowwise_fake,
)
