"""How the MX styles and gathers take their cast: one ``cast=CastSettings(...)``, or,
for one more release, the four keywords it replaces (``fmt``, ``block_size``,
``scale_mode``, ``backend``), which build the same :class:`mx_core.CastSettings` with a
FutureWarning naming the new form.

Reading the four attributes back (:func:`add_cast_fields`) stays, without a warning:
``MXRowwiseParallel`` and ``MXSequenceParallel`` hold a ``block_size`` of their own,
and code that reads ``style.block_size`` of any MX style keeps working.
"""

from __future__ import annotations

import warnings

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
    the styles' defaults: fp8_e4m3, 32, rceil, auto), with a FutureWarning naming
    ``cast=`` (attributed to the code that called ``who``, two frames up).

    Args:
        who: the caller's name in warnings and errors (``"MXColwiseParallel"``).
        cast: the settings given as one, or None.
        fmt, block_size, scale_mode, backend: the deprecated keywords, None where not
            given.

    Returns:
        The :class:`mx_core.CastSettings` to use.

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
    if given:
        old_form = ", ".join(f"{k}=..." for k in given)
        warnings.warn(
            f"{who}({old_form}) is deprecated and will be removed in the next release: "
            f"pass cast=mx_core.CastSettings({old_form})",
            FutureWarning,
            stacklevel=3,
        )
    try:
        return CastSettings(**given)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{who}: {e}") from None


def add_cast_fields(cls: type) -> type:
    """Give ``cls``, which holds a ``cast: CastSettings``, the four read-only attributes
    the styles and ``GatheredCast`` had before they took one ``cast`` (``fmt``,
    ``block_size``, ``scale_mode``, ``backend``: plain strings and an int; reading them
    warns of nothing, see the module doc). A class decorator, so that NamedTuples can
    take it too.

    Args:
        cls: the class to give them to.

    Returns:
        ``cls`` itself.
    """

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
