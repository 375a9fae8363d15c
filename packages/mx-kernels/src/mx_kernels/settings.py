"""mx-kernels' switches: every environment variable it reads, parsed and checked here,
each read when it matters (never at import), so that setting one in a running process
takes effect from the next call that reads it.

- ``MX_KERNELS_MM_DESIGN``: ``dequant_bf16`` (unset), ``dot_scaled`` or ``fp8_mma``;
  read by each ``scaled_mm`` that runs the ``"triton"`` backend and by
  ``bf16_gemm_design`` (:func:`mm_design`).
- ``MX_KERNELS_INLINE``: ``1`` (unset) or ``0``; read when torch.compile traces an
  ``inline`` fake-quantize overload of a CUDA tensor (:func:`inline_casts`).
- ``MX_KERNELS_CACHED_LAUNCH``: ``1`` (unset) or ``0``; read on each launch of a Triton
  cast kernel (:func:`cached_launch`).
- ``MX_KERNELS_CHECK_LAUNCH``: ``0`` (unset) or ``1``; read on each launch of a Triton
  cast kernel that the cache serves, i.e. on CUDA (:func:`check_launch`).
- ``TRITON_INTERPRET``: Triton's own; on for ``1``, ``true``, ``yes``, ``on`` or ``y`` in
  any case, else off; read by each op called on a non-CUDA tensor (the backend choice,
  the plan's key) and when tracing an inline overload (:func:`triton_interpret`).

Any other value of an ``MX_KERNELS_*`` variable, the empty string included, is a
ValueError naming the variable, the value and the allowed values, raised by the call
that reads it. ``TRITON_INTERPRET`` belongs to Triton: it is read here as Triton reads
it (anything else is off), so that both agree on whether kernels are interpreted.

Cost: a cast reads two variables per call on CUDA (one each: :mod:`mx_kernels.launch`),
where a call's host time is 13-21 us. ``os.environ.get`` of an unset variable took
0.7-1.5 us on the CPU machine (the miss raises and catches a KeyError inside
``Mapping.get``); reading the dict that backs ``os.environ`` (``os.environ._data``,
CPython's) takes 0.09 us a switch, with ``os.environ.get`` where that dict is missing.
Measured with ``tools/bench/host_cost.py --cpu-stub``: the cast's launch 1.0 -> 1.2-1.3
us, the public function 0.2-0.4 us more per call than with the variables read at import.
Both see every change made through ``os.environ`` (``monkeypatch.setenv`` included);
neither sees a bare ``os.putenv``.
"""

from __future__ import annotations

import os

__all__ = [
    "DEFAULT_DESIGN",
    "DESIGNS",
    "cached_launch",
    "check_launch",
    "inline_casts",
    "mm_design",
    "triton_interpret",
]

DESIGNS: tuple[str, ...] = ("dot_scaled", "fp8_mma", "dequant_bf16")
"""Designs of the ``"triton"`` matmul backend (:mod:`mx_kernels.matmul_triton`)."""
DEFAULT_DESIGN = "dequant_bf16"
"""The design while ``MX_KERNELS_MM_DESIGN`` is unset: the fastest on the H200 at every
benchmark shape (BENCHMARKS.md)."""

_FLAGS = {"0": False, "1": True}
_TRITON_TRUE = ("1", "true", "yes", "on", "y")  # triton's getenv_bool


def _raw(name: str) -> str | None:
    """``os.environ.get(name)``, at a fraction of its cost for an unset name (module doc)."""
    env = os.environ
    data = getattr(env, "_data", None)
    if data is None:  # not CPython's os._Environ
        return env.get(name)
    value = data.get(env.encodekey(name))
    return None if value is None else env.decodevalue(value)


def _flag_reader(fn_name: str, name: str, default: bool, doc: str):
    """The public function ``fn_name`` reading switch ``name``: one dict lookup on the key
    of ``name`` in the dict behind ``os.environ`` (module doc), the key made once here."""
    key = os.environ.encodekey(name)

    def read() -> bool:
        data = getattr(os.environ, "_data", None)
        if data is not None and data.get(key) is None:
            return default
        raw = _raw(name)
        if raw is None:
            return default
        value = _FLAGS.get(raw)
        if value is None:
            raise ValueError(
                f"{name}={raw!r} is not a value of this switch; allowed: '0' (off) and "
                f"'1' (on), or unset ({'on' if default else 'off'})"
            )
        return value

    read.__name__ = read.__qualname__ = fn_name
    read.__doc__ = doc
    return read


cached_launch = _flag_reader(
    "cached_launch",
    "MX_KERNELS_CACHED_LAUNCH",
    True,
    """``MX_KERNELS_CACHED_LAUNCH`` (default on): whether Triton cast launches go through
    mx-kernels' cache of compiled kernels (:mod:`mx_kernels.launch`); off sends each
    through Triton's JIT, to rule the cache out when something looks wrong.

    Returns:
        Whether the switch is on.

    Raises:
        ValueError: a value other than ``0`` or ``1``.
    """,
)


check_launch = _flag_reader(
    "check_launch",
    "MX_KERNELS_CHECK_LAUNCH",
    False,
    """``MX_KERNELS_CHECK_LAUNCH`` (default off): whether each cached launch first checks
    that Triton's JIT would pick the same compiled kernel (slow: for debugging and the
    GPU benchmarks' ``--check``).

    Returns:
        Whether the switch is on.

    Raises:
        ValueError: a value other than ``0`` or ``1``.
    """,
)


inline_casts = _flag_reader(
    "inline_casts",
    "MX_KERNELS_INLINE",
    True,
    """``MX_KERNELS_INLINE`` (default on): whether torch.compile replaces the inline
    fake-quantize overloads by their kernel launch (:mod:`mx_kernels.inline_casts`); off
    keeps them ops (A/B timing, ruling the replacement out).

    Returns:
        Whether the switch is on.

    Raises:
        ValueError: a value other than ``0`` or ``1``.
    """,
)


def mm_design() -> str:
    """``MX_KERNELS_MM_DESIGN``: the design of the ``"triton"`` matmul backend, one of
    :data:`DESIGNS` (default :data:`DEFAULT_DESIGN`).

    Returns:
        The design's name.

    Raises:
        ValueError: a value not in :data:`DESIGNS`.
    """
    raw = _raw("MX_KERNELS_MM_DESIGN")
    if raw is None:
        return DEFAULT_DESIGN
    if raw not in DESIGNS:
        raise ValueError(
            f"MX_KERNELS_MM_DESIGN={raw!r} is not a design of the triton matmul; allowed: "
            f"{', '.join(DESIGNS)}, or unset ({DEFAULT_DESIGN})"
        )
    return raw


def triton_interpret() -> bool:
    """``TRITON_INTERPRET``, as Triton reads it.

    Returns:
        Whether Triton runs kernels on CPU tensors in its interpreter.
    """
    raw = _raw("TRITON_INTERPRET")
    return raw is not None and raw.lower() in _TRITON_TRUE
