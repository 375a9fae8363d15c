"""Element codec: fp32 values (already divided by the block scale) <-> element codes.

Encoding rounds to nearest, ties to even, and saturates to +-max_normal. NaN inputs
are not handled here: :func:`mx_core.quantize` marks whole blocks NaN instead.
"""

from __future__ import annotations

import torch

from mx_core.formats import ElementFormat

__all__ = ["encode", "decode", "round_to_format"]


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) for finite fp32 a > 0 read off the exponent field (-127 for 0)."""
    biased = torch.bitwise_and(torch.bitwise_right_shift(a.view(torch.int32), 23), 0xFF)
    return biased - 127


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """Exact fp32 2^e for int32 e in [-126, 127]."""
    return torch.bitwise_left_shift(e + 127, 23).view(torch.float32)


def round_to_format(scaled: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Round fp32 values onto ``fmt``'s grid (nearest, ties to even, saturating).

    Args:
        scaled: values already divided by their block scale, any shape.
        fmt: the element format.

    Returns:
        fp32 values of ``fmt``'s grid, ``scaled``'s shape.
    """
    magnitude = scaled.abs().clamp(max=fmt.max_normal)
    # Subnormals share the smallest normal binade's spacing, 2^(emin - mbits).
    exponent = _floor_log2(magnitude).clamp(min=fmt.emin)
    quantum = _pow2(exponent - fmt.mbits)
    rounded = torch.round(magnitude / quantum) * quantum  # torch.round ties to even
    return torch.copysign(rounded, scaled)


def encode(scaled: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Element codes of ``scaled`` values (rounded as :func:`round_to_format`).

    Args:
        scaled: values already divided by their block scale, any shape and float dtype.
        fmt: the element format.

    Returns:
        ``scaled``'s shape in ``fmt.storage_dtype``: float8 for fp8 formats, else uint8
        codes (one per byte, unpacked; sign in bit ``bits - 1``).
    """
    scaled = scaled.to(torch.float32)
    if fmt.is_fp8:
        # torch's fp32 -> float8 cast rounds to nearest even; clamp first so that
        # overflow saturates (e5m2 would otherwise round to Inf).
        return scaled.clamp(-fmt.max_normal, fmt.max_normal).to(fmt.storage_dtype)
    rounded = round_to_format(scaled, fmt).abs()
    is_normal = rounded >= fmt.min_normal
    exponent = _floor_log2(rounded).clamp(min=fmt.emin)
    exp_field = torch.where(is_normal, exponent + fmt.bias, torch.zeros_like(exponent))
    # Within the binade (or the subnormal range) the code's fraction is value / quantum.
    frac = (rounded / _pow2(exponent - fmt.mbits)).to(torch.int32)
    frac = torch.where(is_normal, frac - (1 << fmt.mbits), frac)
    sign = torch.signbit(scaled).to(torch.int32)
    code = torch.bitwise_or(
        torch.bitwise_left_shift(sign, fmt.bits - 1),
        torch.bitwise_or(torch.bitwise_left_shift(exp_field, fmt.mbits), frac),
    )
    return code.to(torch.uint8)


def decode(codes: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """The values of element codes.

    Args:
        codes: float8 (fp8 formats) or unpacked uint8 codes, any shape.
        fmt: their element format.

    Returns:
        fp32 values, ``codes``' shape.
    """
    if fmt.is_fp8:
        return codes.to(torch.float32)
    table = fmt.code_values.to(codes.device)
    return table[codes.to(torch.int64)]
