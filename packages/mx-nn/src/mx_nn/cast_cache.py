"""Casts of an input that several MXLinear layers share, computed once.

In a decoder block q, k and v read the same normalised activations, and so do the
MLP's gate and up projections; each layer would cast that input again (forward: the
rowwise cast; backward: the columnwise cast for dW), and at the per-rank shapes of
tensor parallelism those casts cost as much as the GEMMs they feed (BENCHMARKS.md,
2026-12-03 'Host cost per op'). :func:`cast_shared` keeps the last cast made at each
call site of MXLinear together with the tensor it was made from, and hands it out again
while the same tensor (same storage, view, dtype and version counter) comes back with
the same cast arguments. Holding the source tensor keeps its memory from being reused
by another tensor that could match the key. An in-place change bumps the version
counter and so misses; writes through ``.data`` bypass the counter and are not seen
(as everywhere in autograd).

Eager only: under torch.compile the casts are plain ops in the graph, and identical
calls on one input are merged by the compiler's common-subexpression elimination.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.distributed.tensor import DTensor

__all__ = [
    "cast_shared", "cast_shared_plan", "clear_cast_cache", "has_entry", "peek_cast", "prime_cast",
]  # fmt: skip


class _Entry(NamedTuple):
    source: torch.Tensor
    key: tuple
    out: object


_ENTRIES: dict[str, _Entry] = {}


def _identity(x: torch.Tensor) -> tuple:
    """What makes two tensors hold the same values without comparing them."""
    placements = None
    if isinstance(x, DTensor):
        placements = (x.placements, id(x.device_mesh))
        x = x._local_tensor
    return (
        x.untyped_storage().data_ptr(), x.storage_offset(), x.shape, x.stride(), x.dtype,
        x.device, x._version, placements,
    )  # fmt: skip


def _key(x: torch.Tensor, cast, args: tuple, kwargs: dict) -> tuple:
    return (_identity(x), cast, args, tuple(sorted(kwargs.items())))


def cast_shared(site: str, cast, x: torch.Tensor, *args, **kwargs):
    """``cast(x, *args, **kwargs)``, or the result of the last call at ``site`` when it
    was made from the same tensor with the same arguments (see the module doc)."""
    if torch.compiler.is_compiling():
        return cast(x, *args, **kwargs)
    key = _key(x, cast, args, kwargs)
    entry = _ENTRIES.get(site)
    if entry is not None and entry.key == key:
        return entry.out
    out = cast(x, *args, **kwargs)
    _ENTRIES[site] = _Entry(x, key, out)
    return out


def cast_shared_plan(site: str, plan, x: torch.Tensor):
    """:func:`cast_shared` of a cast plan (``mx_kernels.cast_plan``): ``plan(x)``, or
    the last result at ``site`` when it came from the same plan and tensor. The plan
    stands for the cast and all its arguments, so it keys in their place. Eager only,
    as its callers (the plans run only there)."""
    key = (_identity(x), plan)
    entry = _ENTRIES.get(site)
    if entry is not None and entry.key == key:
        return entry.out
    out = plan(x)
    _ENTRIES[site] = _Entry(x, key, out)
    return out


def has_entry(site: str) -> bool:
    """Whether anything is kept at ``site``."""
    return site in _ENTRIES


def peek_cast(site: str, cast, x: torch.Tensor, *args, **kwargs):
    """What ``cast_shared(site, cast, x, *args, **kwargs)`` would hand out without
    casting, or None: nothing is cast or kept. None under torch.compile."""
    if torch.compiler.is_compiling():
        return None
    entry = _ENTRIES.get(site)
    if entry is not None and entry.key == _key(x, cast, args, kwargs):
        return entry.out
    return None


def prime_cast(site: str, cast, x: torch.Tensor, out, *args, **kwargs) -> None:
    """Make ``out`` what the next ``cast_shared(site, cast, x, *args, **kwargs)`` returns
    while ``x`` is unchanged: a result of that cast known from elsewhere (an MX gather
    that made it). No-op under torch.compile, as :func:`cast_shared`."""
    if torch.compiler.is_compiling():
        return
    _ENTRIES[site] = _Entry(x, _key(x, cast, args, kwargs), out)


def clear_cast_cache() -> None:
    """Drop every kept cast and the tensors they were made from."""
    _ENTRIES.clear()
