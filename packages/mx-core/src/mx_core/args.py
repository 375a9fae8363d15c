"""Checks of the integer arguments that mx-core's public functions take (block sizes,
dims, sizes): a bool is refused although Python counts it as an int, since
``block_size=True`` or ``dim=False`` is a mistake that would otherwise run as 1 or 0."""

from __future__ import annotations

__all__ = ["check_dim", "check_int"]


def check_int(fn: str, name: str, value: object, *, minimum: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool) of at least ``minimum``.

    Args:
        fn: the calling function's name, for messages.
        name: the argument's name, for messages.
        value: the value to check.
        minimum: the smallest value allowed (None: any int).

    Returns:
        ``value``.

    Raises:
        TypeError: not an int, or a bool; the message names ``fn`` and ``name``.
        ValueError: below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{fn}: {name}={value} must be >= {minimum}")
    return value


def check_dim(fn: str, name: str, dim: object, ndim: int) -> int:
    """``dim`` (an int in [-ndim, ndim)) made non-negative.

    Args:
        fn: the calling function's name, for messages.
        name: the argument's name, for messages.
        dim: the dim to check, negative counting from the end.
        ndim: the tensor's number of dims.

    Returns:
        ``dim`` in [0, ndim).

    Raises:
        TypeError: not an int, or a bool.
        ValueError: out of range; the message gives the allowed range.
    """
    check_int(fn, name, dim)
    if ndim == 0:
        raise ValueError(f"{fn}: {name}={dim}: a 0-d tensor has no dim")
    if not -ndim <= dim < ndim:
        raise ValueError(
            f"{fn}: {name}={dim} is out of range for {ndim} dims (allowed: {-ndim} .. {ndim - 1})"
        )
    return dim % ndim
