"""Element formats of the OCP Microscaling (MX) v1.0 spec.

Each format is a small float with a sign bit, ``ebits`` exponent bits and ``mbits``
mantissa bits. Every block of ``block_size`` elements shares one E8M0 scale
(see :mod:`mx_core.scale`).

===========  =====  =====  ====  ==========  ============  ===============
name         ebits  mbits  emax  max normal  min normal    min subnormal
===========  =====  =====  ====  ==========  ============  ===============
fp8_e4m3     4      3      8     448         2^-6          2^-9
fp8_e5m2     5      2      15    57344       2^-14         2^-16
fp6_e2m3     2      3      2     7.5         1             0.125
fp6_e3m2     3      2      4     28          0.25          0.0625
fp4_e2m1     2      1      2     6           1             0.5
===========  =====  =====  ====  ==========  ============  ===============

Storage: fp8 in torch's float8 dtypes; fp6 as 6-bit codes in uint8 (one per byte, see
:mod:`mx_core.packing` for 4-in-3-bytes); fp4 as codes packed two per byte along the
block dim, first element in the low nibble (the layout of ``torch.float4_e2m1fn_x2``).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import cached_property

import torch

__all__ = ["ElementFormat", "FORMAT_NAMES", "get_format"]


@dataclass(frozen=True, kw_only=True)
class ElementFormat:
    """Properties of one MX element format (all values are plain Python numbers)."""

    name: str
    """The format's name, e.g. ``"fp8_e4m3"``."""
    ebits: int
    """Exponent bits."""
    mbits: int
    """Mantissa (fraction) bits."""
    max_normal: float
    """Largest finite magnitude; scaled values beyond it saturate to it."""
    has_inf: bool
    """Whether the format encodes +-Inf (only fp8_e5m2)."""
    has_nan: bool
    """Whether the format encodes NaN (the fp8 formats)."""
    storage_dtype: torch.dtype
    """The dtype of ``MXTensor.qdata`` for this format."""

    @property
    def bits(self) -> int:
        """Bits per element: 1 + ebits + mbits."""
        return 1 + self.ebits + self.mbits

    @property
    def bias(self) -> int:
        """Exponent bias, 2^(ebits-1) - 1."""
        return (1 << (self.ebits - 1)) - 1

    @property
    def emax(self) -> int:
        """Unbiased exponent of ``max_normal`` (floor(log2(max_normal)))."""
        return _floor_log2(self.max_normal)

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal, 1 - bias."""
        return 1 - self.bias

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2^emin."""
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        """Smallest positive subnormal value, 2^(emin - mbits)."""
        return 2.0 ** (self.emin - self.mbits)

    @property
    def nan_code(self) -> int | None:
        """The positive NaN bit pattern, or None where the format has no NaN."""
        if not self.has_nan:
            return None
        return 0x7F  # e4m3fn: S.1111.111; e5m2: S.11111.11 (a quiet NaN)

    @property
    def is_packed(self) -> bool:
        """True for fp4, whose qdata holds two elements per byte along the block dim."""
        return self.bits == 4

    @property
    def is_fp8(self) -> bool:
        """True where torch has a native dtype (qdata is float8)."""
        return self.bits == 8

    @property
    def max_normal_mantissa_bits(self) -> int:
        """The 23-bit fp32 fraction field of ``max_normal`` (used by the RCEIL scale)."""
        return _fp32_fraction(self.max_normal)

    @cached_property
    def code_values(self) -> torch.Tensor:
        """fp32 value of every code 0 .. 2^bits - 1, shape [2^bits] (NaN for NaN codes)."""
        return torch.tensor(
            [self._decode_one(c) for c in range(1 << self.bits)], dtype=torch.float32
        )

    def _decode_one(self, code: int) -> float:
        sign = -1.0 if code >> (self.bits - 1) else 1.0
        exp_field = (code >> self.mbits) & ((1 << self.ebits) - 1)
        frac = code & ((1 << self.mbits) - 1)
        if self.is_fp8 and (code & 0x7F) == 0x7F:
            return float("nan")
        if self.has_inf and exp_field == (1 << self.ebits) - 1:
            return float("nan") if frac else sign * float("inf")
        if exp_field == 0:
            return sign * frac * self.min_subnormal
        return sign * (1.0 + frac / (1 << self.mbits)) * 2.0 ** (exp_field - self.bias)


def _floor_log2(value: float) -> int:
    return math.frexp(value)[1] - 1


def _fp32_fraction(value: float) -> int:
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    return bits & 0x7FFFFF


_FORMATS: dict[str, ElementFormat] = {
    f.name: f
    for f in (
        ElementFormat(
            name="fp8_e4m3",
            ebits=4,
            mbits=3,
            max_normal=448.0,
            has_inf=False,
            has_nan=True,
            storage_dtype=torch.float8_e4m3fn,
        ),
        ElementFormat(
            name="fp8_e5m2",
            ebits=5,
            mbits=2,
            max_normal=57344.0,
            has_inf=True,
            has_nan=True,
            storage_dtype=torch.float8_e5m2,
        ),
        ElementFormat(
            name="fp6_e2m3",
            ebits=2,
            mbits=3,
            max_normal=7.5,
            has_inf=False,
            has_nan=False,
            storage_dtype=torch.uint8,
        ),
        ElementFormat(
            name="fp6_e3m2",
            ebits=3,
            mbits=2,
            max_normal=28.0,
            has_inf=False,
            has_nan=False,
            storage_dtype=torch.uint8,
        ),
        ElementFormat(
            name="fp4_e2m1",
            ebits=2,
            mbits=1,
            max_normal=6.0,
            has_inf=False,
            has_nan=False,
            storage_dtype=torch.uint8,
        ),
    )
}

FORMAT_NAMES: tuple[str, ...] = tuple(_FORMATS)
"""Names accepted wherever a format is asked for."""


def get_format(fmt: str | ElementFormat, *, arg: str = "fmt") -> ElementFormat:
    """Look a format up by name (an :class:`ElementFormat` passes through).

    Args:
        fmt: a name of :data:`FORMAT_NAMES` (``"fp8_e4m3"``, ...) or an ElementFormat.
        arg: the argument's name in messages.

    Returns:
        The :class:`ElementFormat`.

    Raises:
        ValueError: unknown name; the message names ``arg`` and the allowed names.
        TypeError: neither a string nor an ElementFormat.
    """
    if isinstance(fmt, ElementFormat):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"{arg} must be a format name (str), got {type(fmt).__name__}")
    try:
        return _FORMATS[fmt]
    except KeyError:
        raise ValueError(
            f"{arg}={fmt!r} is not an MX element format; allowed: {', '.join(FORMAT_NAMES)}"
        ) from None
