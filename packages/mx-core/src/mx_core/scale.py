"""E8M0 shared-scale math: the power-of-two exponent ``e`` of a block from its amax.

A block's elements are stored as ``round(x / 2^e)`` and decoded as ``q * 2^e``. E8M0
stores ``e + 127`` in one byte: byte 0 is 2^-127, byte 254 is 2^127, byte 255 is NaN
(there is no zero). With ``amax = |max| of the block`` and the element format's
``emax`` and ``max_normal`` (see :mod:`mx_core.formats`):

=======  ==============================================================  ===============
mode     e                                                               used by
=======  ==============================================================  ===============
floor    floor(log2(amax)) - emax                                        OCP MX v1.0
ceil     ceil(log2(amax)) - emax                                         (no overflow)
even     floor(log2(amax rounded to mbits mantissa bits)) - emax         torchao EVEN
rceil    ceil(log2(amax / max_normal)), i.e. amax/max_normal rounded     NVIDIA cuBLAS, TE
         up to a power of two (PTX ``cvt.rp.satfinite.ue8m0x2.f32``)
=======  ==============================================================  ===============

Every mode clamps ``e`` to [-127, 127]. A zero block (amax 0) gets byte 0; a block with
NaN or +-Inf gets byte 255. Values that land above ``max_normal`` after scaling
(floor and even modes) saturate.

At the top of the input dtype's range every mode saturates as the floor mode (the OCP
spec's conversion) does. With ``T`` the exponent of the dtype's largest power of two
(127 for fp32 and bf16, 15 for fp16): where amax rounded to ``mbits`` mantissa bits
reaches 2^(T+1), ``e = T - emax``. The ceil, even and rceil exponents would be one
more there, and the block's largest element would round up to 2^emax and decode to
2^(T+1), beyond the dtype (fp32's max in rceil to fp8_e4m3: e = 120, 255.99 rounds to
256, and 256 * 2^120 is inf). With ``e = T - emax`` it saturates to ``max_normal``
instead. Only such blocks change: every block whose round trip was finite keeps its
exponent.

All four are computed exactly from the fp32 bit pattern of amax with integer
arithmetic, which is how the Triton kernels compute them too: with ``E`` the biased
exponent field and ``F`` the 23-bit fraction field of fp32(amax),

- floor: ``E - 127 - emax``
- ceil:  ``E - 127 - emax + (F != 0)``
- even:  ``E' - 127 - emax`` where ``E'`` is the exponent field after adding half an
  ulp of an ``mbits`` mantissa to the bits (a carry means rounding reached the next
  power of two; ties carry under round-half-even too, since the kept bits are all ones)
- rceil: ``E - 127 - emax + (F > F_max)`` where ``F_max`` is max_normal's fraction field
- then in every mode ``T - emax`` where ``E' - 127 > T`` (amax rounds up past 2^T's
  binade; ``E'`` as in the even mode)

fp32 subnormal amax (E = 0) always lands on the clamp, -127, in every mode.
"""

from __future__ import annotations

import math

import torch

from mx_core.choices import Choice
from mx_core.formats import ElementFormat, get_format

__all__ = [
    "E8M0_BIAS",
    "E8M0_NAN",
    "ScaleMode",
    "get_scale_mode",
    "scale_exponent",
    "top_exponent",
    "exponent_to_e8m0",
    "e8m0_to_exponent",
    "e8m0_to_float",
]

E8M0_BIAS = 127
"""Bias of the E8M0 scale byte: byte = e + 127."""
E8M0_NAN = 255
"""The E8M0 NaN byte, written for blocks holding NaN or +-Inf."""
_E_MIN, _E_MAX = -127, 127


class ScaleMode(Choice, noun="a scale mode", arg="scale_mode"):
    """How a block's E8M0 exponent is derived from its amax (formulas in the module doc).

    A ``str`` enum (:class:`mx_core.choices.Choice`): ``ScaleMode.parse("rceil")``.
    """

    FLOOR = "floor"
    CEIL = "ceil"
    EVEN = "even"
    RCEIL = "rceil"


def get_scale_mode(mode: str | ScaleMode, *, arg: str = "scale_mode") -> ScaleMode:
    """Parse a scale mode by name (a :class:`ScaleMode` passes through).

    Args:
        mode: ``"floor"``, ``"ceil"``, ``"even"``, ``"rceil"`` or a ScaleMode.
        arg: the argument's name in messages.

    Returns:
        The :class:`ScaleMode`.

    Raises:
        ValueError: unknown name; the message names ``arg`` and the allowed names.
    """
    if isinstance(mode, ScaleMode):
        return mode
    try:
        return ScaleMode(mode)
    except ValueError:
        allowed = ", ".join(m.value for m in ScaleMode)
        raise ValueError(f"{arg}={mode!r} is not a scale mode; allowed: {allowed}") from None


def top_exponent(dtype: torch.dtype) -> int:
    """``T``, the exponent of the largest power of two of ``dtype`` that the scale math
    keeps blocks under (see the module doc): 127 for fp32 and bf16, 15 for fp16; at
    most 127, since amax is read as fp32.

    Args:
        dtype: the input's floating-point dtype.

    Returns:
        ``T``, an int.

    Raises:
        TypeError: ``dtype`` is not a floating-point dtype.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"top_exponent: dtype must be a floating-point torch.dtype, got {dtype!r}")
    return min(math.frexp(torch.finfo(dtype).max)[1] - 1, _E_MAX)


def scale_exponent(
    amax: torch.Tensor, fmt: str | ElementFormat, scale_mode: str | ScaleMode
) -> torch.Tensor:
    """Unbiased E8M0 exponent ``e`` (int32, clamped to [-127, 127]) of each block amax.

    Args:
        amax: per-block max magnitude, any shape, in the input's float dtype (values
            >= 0): its dtype sets the top of the range (:func:`top_exponent`). Non-finite
            entries give an unspecified exponent: callers mark those blocks NaN.
        fmt: element format.
        scale_mode: one of :class:`ScaleMode`.
    Returns:
        int32 tensor of amax's shape.
    Raises:
        TypeError: amax is not a floating-point tensor.
    """
    f = get_format(fmt)
    mode = get_scale_mode(scale_mode)
    if not isinstance(amax, torch.Tensor) or not amax.dtype.is_floating_point:
        got = amax.dtype if isinstance(amax, torch.Tensor) else type(amax).__name__
        raise TypeError(f"scale_exponent: amax must be a floating-point tensor, got {got}")
    top = top_exponent(amax.dtype)
    bits = amax.to(torch.float32).view(torch.int32)
    fraction = torch.bitwise_and(bits, 0x7FFFFF)
    biased = torch.bitwise_and(torch.bitwise_right_shift(bits, 23), 0xFF)
    # The exponent of amax rounded to mbits mantissa bits (half an ulp added: a carry
    # reaches the next power of two).
    rounded = torch.bitwise_right_shift(bits + (1 << (23 - f.mbits - 1)), 23)
    rounded = torch.bitwise_and(rounded, 0xFF)
    e = (rounded if mode is ScaleMode.EVEN else biased) - (E8M0_BIAS + f.emax)
    if mode is ScaleMode.CEIL:
        e = e + (fraction != 0).to(torch.int32)
    elif mode is ScaleMode.RCEIL:
        e = e + (fraction > f.max_normal_mantissa_bits).to(torch.int32)
    # Saturate where the block would decode past the input dtype (module doc).
    e = torch.where(rounded > E8M0_BIAS + top, top - f.emax, e)
    return e.clamp(_E_MIN, _E_MAX).to(torch.int32)


def exponent_to_e8m0(e: torch.Tensor, nan_mask: torch.Tensor | None = None) -> torch.Tensor:
    """E8M0 scales from unbiased exponents.

    Args:
        e: int exponents in [-127, 127], any shape.
        nan_mask: bool, broadcastable to ``e``: blocks whose scale is NaN (byte 255).

    Returns:
        ``torch.float8_e8m0fnu`` of ``e``'s shape (byte ``e + 127``).
    """
    byte = (e + E8M0_BIAS).to(torch.uint8)
    if nan_mask is not None:
        byte = torch.where(nan_mask, torch.full_like(byte, E8M0_NAN), byte)
    return byte.view(torch.float8_e8m0fnu)


def e8m0_to_exponent(scale: torch.Tensor) -> torch.Tensor:
    """Unbiased exponent of each E8M0 byte.

    Args:
        scale: E8M0 (or uint8) scales, any shape.

    Returns:
        int32 of ``scale``'s shape, byte - 127 (NaN bytes give 128).
    """
    return scale.view(torch.uint8).to(torch.int32) - E8M0_BIAS


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """The value 2^e of each E8M0 byte.

    Args:
        scale: E8M0 (or uint8) scales, any shape.

    Returns:
        fp32 of ``scale``'s shape (byte 0 is the fp32 subnormal 2^-127; 255 is NaN).
    """
    byte = scale.view(torch.uint8).to(torch.int32)
    # 2^(byte-127) built from fp32 bits: normal for byte >= 1, 2^-127 = bit 22 for byte 0.
    bits = torch.where(
        byte == 0, torch.full_like(byte, 1 << 22), torch.bitwise_left_shift(byte, 23)
    )
    bits = torch.where(byte == E8M0_NAN, torch.full_like(byte, 0x7FC00000), bits)
    return bits.view(torch.float32)
