"""``CastSettings``: the four settings of one MX cast as one frozen value.

A cast of a tensor to MX is fixed by its element format, its block size, its scale mode
and the kernel backend that runs it. The first three fix the values (codes and scales);
the backend does not (mx-kernels' backends are bit-exact to mx-core's reference), so
two casts whose settings differ only in backend give the same values:
:meth:`CastSettings.same_values`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mx_core.choices import CastBackend, ElementFormatName
from mx_core.formats import ElementFormat
from mx_core.scale import ScaleMode

__all__ = ["CastSettings"]


@dataclass(frozen=True, kw_only=True, repr=False)
class CastSettings:
    """The settings of one MX cast (keyword-only, frozen, hashable).

    The choices may be given as their strings or ``fmt`` as one of mx-core's
    :class:`ElementFormat` objects; they are stored as enum members (which still compare
    equal to the strings), so ``CastSettings(fmt="fp8_e4m3") ==
    CastSettings(fmt=ElementFormatName.FP8_E4M3)`` and both hash alike.

    Raises:
        TypeError: a choice that is not a string (nor an ElementFormat for ``fmt``), or
            ``block_size`` not an int (a bool is refused).
        ValueError: an unknown choice (the message lists the allowed ones), or
            ``block_size`` not a positive multiple of 2.
    """

    fmt: ElementFormatName = ElementFormatName.FP8_E4M3
    """Element format, e.g. ``"fp8_e4m3"``."""
    block_size: int = 32
    """Elements per E8M0 scale, along the blocked dim."""
    scale_mode: ScaleMode = ScaleMode.RCEIL
    """How each block's exponent is derived from its amax, e.g. ``"rceil"``."""
    backend: CastBackend = CastBackend.AUTO
    """Which implementation runs the cast: ``"auto"``, ``"triton"`` or ``"reference"``."""

    def __post_init__(self) -> None:
        # Normalising only: each field keeps the value it was given, as its enum member.
        object.__setattr__(self, "fmt", ElementFormatName.parse(self.fmt, arg="fmt"))
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, int):
            raise TypeError(f"block_size must be an int, got {type(bs).__name__} {bs!r}")
        if bs <= 0 or bs % 2:
            raise ValueError(f"block_size={bs} must be a positive multiple of 2")
        object.__setattr__(self, "scale_mode", ScaleMode.parse(self.scale_mode))
        object.__setattr__(self, "backend", CastBackend.parse(self.backend))

    @property
    def format(self) -> ElementFormat:
        """The element format's properties (``mx_core.get_format(self.fmt)``)."""
        return self.fmt.format

    def same_values(self, other: CastSettings) -> bool:
        """Whether a cast with ``other`` gives the same codes and scales: the same format,
        block size and scale mode (the backends may differ).

        Raises:
            TypeError: ``other`` is not a CastSettings.
        """
        if not isinstance(other, CastSettings):
            raise TypeError(f"other must be a CastSettings, got {type(other).__name__}")
        return (self.fmt, self.block_size, self.scale_mode) == (
            other.fmt,
            other.block_size,
            other.scale_mode,
        )

    def as_kwargs(self) -> dict[str, str | int]:
        """The settings as plain keyword arguments (strings and an int), as mx-kernels'
        casts take them: ``mx_kernels.quantize_rowwise(x, **settings.as_kwargs())``."""
        return {
            "fmt": self.fmt.value,
            "block_size": self.block_size,
            "scale_mode": self.scale_mode.value,
            "backend": self.backend.value,
        }

    def __repr__(self) -> str:
        return (
            f"CastSettings(fmt={self.fmt.value!r}, block_size={self.block_size}, "
            f"scale_mode={self.scale_mode.value!r}, backend={self.backend.value!r})"
        )
