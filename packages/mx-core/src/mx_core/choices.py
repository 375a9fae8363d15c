"""String enums of the named choices an MX cast and an MX linear take.

Each member is a ``str`` (it compares, hashes and formats as its value, so
``ScaleMode.RCEIL == "rceil"`` and ``f"{ScaleMode.RCEIL}" == "rceil"``), and each enum's
``parse(value)`` takes a member or its exact value, the strings users write today:

====================  =================================================  ===============
enum                  values                                             used for
====================  =================================================  ===============
ElementFormatName     fp8_e4m3, fp8_e5m2, fp6_e2m3, fp6_e3m2, fp4_e2m1   element formats
ScaleMode             floor, ceil, even, rceil (:mod:`mx_core.scale`)    E8M0 exponents
CastBackend           auto, triton, reference                            mx-kernels casts
MatmulBackend         auto, emulated, cublas, triton                     ``scaled_mm``
ComputePath           auto, mx, fake_quant                               mx-nn's linears
====================  =================================================  ===============

The backends are listed here as names only: mx-core imports no kernels, and which
backend can run where is mx-kernels' business.
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

from mx_core.formats import FORMAT_NAMES, ElementFormat, get_format

__all__ = ["CastBackend", "Choice", "ComputePath", "ElementFormatName", "MatmulBackend"]

_C = TypeVar("_C", bound="Choice")


class Choice(str, enum.Enum):
    """Base of the string enums here: ``str()`` and ``format()`` give the value, and
    :meth:`parse` reads a member back from its value.

    A subclass names what its values are and the argument they usually come in:
    ``class ScaleMode(Choice, noun="a scale mode", arg="scale_mode")``.
    """

    def __init_subclass__(cls, *, noun: str = "a choice", arg: str = "value", **kwargs: Any):
        super().__init_subclass__(**kwargs)
        cls._noun, cls._arg = noun, arg

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def choices(cls) -> tuple[str, ...]:
        """The values, in definition order, as plain strings."""
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls: type[_C], value: object, *, arg: str | None = None) -> _C:
        """The member whose value is ``value`` (a member passes through).

        Args:
            value: a member, or its exact value (a ``str``; no case folding).
            arg: the argument's name for messages (default: the enum's usual one).
        Raises:
            TypeError: ``value`` is not a string; the message names ``arg``, the value
                and the allowed values.
            ValueError: no member has that value; the same message content.
        """
        if isinstance(value, cls):
            return value
        name = cls._arg if arg is None else arg
        allowed = ", ".join(cls.choices())
        if not isinstance(value, str):
            raise TypeError(
                f"{name} must be {cls._noun} (a str), got {type(value).__name__} {value!r}; "
                f"allowed: {allowed}"
            )
        member = cls._value2member_map_.get(value)
        if member is None:
            raise ValueError(f"{name}={value!r} is not {cls._noun}; allowed: {allowed}")
        return member  # type: ignore[return-value]


class ElementFormatName(Choice, noun="an MX element format", arg="fmt"):
    """Names of the MX element formats (:data:`mx_core.FORMAT_NAMES`, same order)."""

    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    FP6_E2M3 = "fp6_e2m3"
    FP6_E3M2 = "fp6_e3m2"
    FP4_E2M1 = "fp4_e2m1"

    @property
    def format(self) -> ElementFormat:
        """The format's properties (:func:`mx_core.get_format`)."""
        return get_format(self.value)

    @classmethod
    def parse(cls, value: object, *, arg: str | None = None) -> ElementFormatName:
        """As :meth:`Choice.parse`; also takes one of mx-core's :class:`ElementFormat`
        objects (``get_format(name)``), as :func:`mx_core.get_format` does.

        Raises:
            TypeError: neither a string nor an ElementFormat.
            ValueError: an unknown name, or an ElementFormat that is not mx-core's.
        """
        if isinstance(value, ElementFormat):
            if value.name not in FORMAT_NAMES or get_format(value.name) != value:
                name = cls._arg if arg is None else arg
                raise ValueError(
                    f"{name}={value!r} is not an MX element format of mx-core; allowed: "
                    f"{', '.join(cls.choices())}"
                )
            value = value.name
        return super().parse(value, arg=arg)


class CastBackend(Choice, noun="a cast backend", arg="backend"):
    """Backends of mx-kernels' casts: ``auto`` picks Triton where it runs, else the
    reference (mx-core's code)."""

    AUTO = "auto"
    TRITON = "triton"
    REFERENCE = "reference"


class MatmulBackend(Choice, noun="a matmul backend", arg="backend"):
    """Backends of mx-kernels' ``scaled_mm``: ``auto`` picks the fastest that runs."""

    AUTO = "auto"
    EMULATED = "emulated"
    CUBLAS = "cublas"
    TRITON = "triton"


class ComputePath(Choice, noun="a compute path", arg="compute_path"):
    """How mx-nn's linears run their GEMMs: ``mx`` (MX casts, then ``scaled_mm``),
    ``fake_quant`` (casts fused with their dequantize, then high-precision GEMMs on the
    MX values) or ``auto`` (the fused path where ``scaled_mm`` would compute the same
    way, else ``mx``)."""

    AUTO = "auto"
    MX = "mx"
    FAKE_QUANT = "fake_quant"
