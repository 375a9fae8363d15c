"""How the MX styles and gathers take their cast: one ``cast=CastSettings(...)``, or,
for one more release, the four keywords it replaces (``fmt``, ``block_size``,
``scale_mode``, ``backend``), which build the same :class:`mx_core.CastSettings`.
"""

from __future__ import annotations

from mx_core import CastSettings

__all__ = ["CastFields", "add_cast_fields", "cast_from_args"]


def cast_from_args(
    who: str,
    cast: CastSettings | None,
    *,
    fmt: object = None,
    block_size: object = None,
    scale_mode: object = None,
    backend: object = None,
) -> CastSettings:
    """The cast a style or gather was given: ``cast`` itself, else one built from the
    keywords given (None: not given; the others keep CastSettings' defaults, which are
    the styles' defaults: fp8_e4m3, 32, rceil, auto). ``who`` names the caller in errors.

    Raises:
        TypeError: ``cast`` and any of the four keywords both given, or ``cast`` not a
            CastSettings; a keyword of the wrong type.
        ValueError: a keyword's value that CastSettings refuses.
    """
    old = {"fmt": fmt, "block_size": block_size, "scale_mode": scale_mode, "backend": backend}
    given = {k: v for k, v in old.items() if v is not None}
    if cast is not None:
        if given:
            raise TypeError(
                f"{who}: pass either cast=CastSettings(...) or the keywords "
                f"{', '.join(given)}, not both"
            )
        if not isinstance(cast, CastSettings):
            raise TypeError(
                f"{who}: cast must be an mx_core.CastSettings, got {type(cast).__name__}"
            )
        return cast
    try:
        return CastSettings(**given)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{who}: {e}") from None


def add_cast_fields(cls: type) -> type:
    """Give ``cls``, which holds a ``cast: CastSettings``, the four read-only attributes
    the styles and ``GatheredCast`` had before they took one ``cast`` (``fmt``,
    ``block_size``, ``scale_mode``, ``backend``: plain strings and an int), for one more
    release. A class decorator, so that NamedTuples can take it too."""

    def field(name: str) -> property:
        def get(self) -> object:
            value = getattr(self.cast, name)
            return value if isinstance(value, int) else value.value

        return property(get, doc=f"``cast.{name}`` as a plain value.")

    for name in ("fmt", "block_size", "scale_mode", "backend"):
        setattr(cls, name, field(name))
    return cls


@add_cast_fields
class CastFields:
    """A mixin of the four attributes of :func:`add_cast_fields`, for the styles."""

    cast: CastSettings
