"""An independent oracle of the MX casts: numpy float64 arithmetic for the scale,
ml_dtypes for element rounding. It shares no code with :func:`mx_core.quantize` (only
the format names), so a bug there cannot hide in both. Needs numpy and ml_dtypes.
"""

from __future__ import annotations

import torch

__all__ = ["oracle_quantize"]

_ORACLE_FORMATS = {  # name: (emax, mbits, max_normal, ml_dtypes name)
    "fp8_e4m3": (8, 3, 448.0, "float8_e4m3fn"),
    "fp8_e5m2": (15, 2, 57344.0, "float8_e5m2"),
    "fp6_e2m3": (2, 3, 7.5, "float6_e2m3fn"),
    "fp6_e3m2": (4, 2, 28.0, "float6_e3m2fn"),
    "fp4_e2m1": (2, 1, 6.0, "float4_e2m1fn"),
}


def oracle_quantize(x: torch.Tensor, fmt: str, block_size: int, dim: int, scale_mode: str):
    """Reference of the reference, in numpy float64 (needs numpy and ml_dtypes).

    Args:
        x: the input, any float dtype; blocks along ``dim``.
        fmt: an element format name.
        block_size: elements per scale, dividing ``x.shape[dim]``.
        dim: the blocked dim.
        scale_mode: ``"floor"``, ``"ceil"``, ``"even"`` or ``"rceil"``.

    Returns:
        ``(codes, scale_bytes)``, numpy uint8 arrays: ``codes`` of x's shape (one code
        per element, fp4 unpacked), ``scale_bytes`` of x's shape with ``dim`` divided by
        ``block_size``.

    Raises:
        KeyError: an unknown ``fmt``.
        ValueError: an unknown ``scale_mode``.
    """
    import ml_dtypes
    import numpy as np

    emax, mbits, max_normal, dtype_name = _ORACLE_FORMATS[fmt]
    a = np.moveaxis(x.detach().cpu().double().numpy(), dim, -1)
    lead = a.shape[:-1]
    blocks = a.reshape(*lead, a.shape[-1] // block_size, block_size)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        amax = np.abs(blocks).max(axis=-1)
        finite = np.isfinite(amax)
        safe = np.where(finite & (amax > 0), amax, 1.0)
        if scale_mode == "floor":
            e = np.floor(np.log2(safe)) - emax
        elif scale_mode == "ceil":
            e = np.ceil(np.log2(safe)) - emax
        elif scale_mode == "rceil":
            e = np.ceil(np.log2(safe / max_normal))
        elif scale_mode == "even":
            m, ex = np.frexp(safe)  # safe = m * 2^ex, m in [0.5, 1)
            steps = 2.0 ** (mbits + 1)
            carry = np.round(m * steps) == steps  # np.round: ties to even
            e = ex - 1 + carry - emax
        else:
            raise ValueError(
                f"oracle_quantize: scale_mode={scale_mode!r}; allowed floor, ceil, rceil, even"
            )
        # At the top of x's dtype (2^127, fp16 2^15): amax rounded to mbits bits must stay
        # below twice that, or the block takes the floor exponent (mx_core.scale).
        top = 15 if x.dtype == torch.float16 else 127
        m, ex = np.frexp(safe)
        past_top = ex - 1 + (np.round(m * 2.0 ** (mbits + 1)) == 2.0 ** (mbits + 1)) > top
        e = np.where(past_top, top - emax, e)
        e = np.where(amax > 0, e, -127)
        e = np.clip(np.where(finite, e, 0), -127, 127)
        scaled = blocks / np.exp2(e)[..., None]
        scaled = np.clip(np.where(finite[..., None], scaled, 0.0), -max_normal, max_normal)
    elem_dtype = getattr(ml_dtypes, dtype_name)
    codes = scaled.astype(np.float32).astype(elem_dtype).view(np.uint8)
    fill = 0x7F if fmt.startswith("fp8") else 0
    codes = np.where(finite[..., None], codes, np.uint8(fill)).astype(np.uint8)
    scale_bytes = np.where(finite, e + 127, 255).astype(np.uint8)
    codes = np.moveaxis(codes.reshape(a.shape), -1, dim)
    scale_bytes = np.moveaxis(scale_bytes, -1, dim)
    return codes, scale_bytes
