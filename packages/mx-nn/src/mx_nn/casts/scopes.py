"""Casts of one input that several MXLinear layers read, made once: shared only where
sharing cannot hand out another tensor's cast.

In a decoder block q, k and v read the same normalised activations, and so do the
MLP's gate and up projections; each layer would cast that input again, and at the
per-rank shapes of tensor parallelism those casts cost as much as the GEMMs they feed
(BENCHMARKS.md, 2026-12-03 'Host cost per op'). A cast is shared in two places only:

A cast is shared only within one call of a parent module: ``mx_nn.share_input_casts``
(which ``convert`` and ``parallelize`` call) gives every module with two or more MXLinear
children a scope, :func:`add_cast_scope` one module (``parallelize`` adds the modules
whose input an MX all-gather prepares), ``with shared_casts():`` one block of code. The
scope opens before the module's other forward pre-hooks and closes when its forward
returns or raises; a cast made inside it is handed out again only inside it, for the
same tensor (same storage, view, dtype and version counter) with the same cast
arguments. Nothing outlives the call: a tensor written between two calls without
bumping its version counter (``torch.from_numpy`` arrays, ``.data`` writes, shared
memory) is cast again on the next call, as the plain computation would. An MX gather's
cast of the tensor it hands the module (:func:`prime_cast`) goes into the open scope
too; with none open the layers cast the decoded values again (the same values).

Outside a scope every call casts. Inference tensors (``torch.inference_mode``) track
no version counter, so their casts are never shared. Eager only: under torch.compile the
casts are plain ops in the graph, and identical calls on one input are merged by the
compiler's common-subexpression elimination (the scope hooks do nothing there).

:func:`keep_weight_casts` is the opt-in scope for the weights' casts across the
micro-batches of one gradient-accumulation step.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor

__all__ = [
    "add_cast_scope", "cast_shared", "cast_shared_plan", "cast_weight_kept",
    "keep_weight_casts", "peek_cast", "prime_cast", "shared_casts",
    "weight_casts_kept",
]  # fmt: skip

_HOOKED = "_mx_cast_scope_handles"  # set on modules given scope hooks


class _State(threading.local):
    def __init__(self) -> None:
        self.scopes: list[tuple[int, dict]] = []  # (owner id, site -> entry), innermost last
        self.weights: dict | None = None  # keep_weight_casts' entries, while it is open


_STATE = _State()


def _identity(x: torch.Tensor) -> tuple | None:
    """What makes two tensors hold the same values without comparing them, or None
    where that cannot be known (an inference tensor has no version counter)."""
    placements = None
    if isinstance(x, DTensor):
        placements = (x.placements, id(x.device_mesh))
        x = x._local_tensor
    if isinstance(x, AsyncCollectiveTensor):  # a collective's output, read as it comes
        x = x.trigger_wait()  # (parallelize's embedding before OLMo2's attention)
    if x.is_inference():
        return None
    return (
        x.untyped_storage().data_ptr(), x.storage_offset(), x.shape, x.stride(), x.dtype,
        x.device, x._version, placements,
    )  # fmt: skip


def _find(site: str, key: tuple):
    for _, entries in reversed(_STATE.scopes):  # innermost first
        entry = entries.get(site)
        if entry is not None and entry[0] == key:
            return entry[2]
    return None


def _keep(site: str, x: torch.Tensor, key: tuple, out) -> None:
    """Keep ``out`` in the innermost open scope, if any."""
    if _STATE.scopes:
        # x held: its memory cannot be reused by another tensor while the scope is open.
        _STATE.scopes[-1][1][site] = (key, x, out)


def _key(x: torch.Tensor, cast, args: tuple, kwargs: dict) -> tuple | None:
    ident = _identity(x)
    return None if ident is None else (ident, cast, args, tuple(sorted(kwargs.items())))


def cast_shared(site: str, cast, x: torch.Tensor, *args, **kwargs):
    """``cast(x, *args, **kwargs)``, or the result of the same call at ``site`` made
    earlier in the same scope from the same tensor (see the module doc).

    Args:
        site: the name the results are kept under (the cast's name).
        cast: the cast function.
        x: the tensor to cast.
        *args, **kwargs: the cast's other arguments (part of the key).

    Returns:
        What ``cast`` returns.
    """
    if torch.compiler.is_compiling():
        return cast(x, *args, **kwargs)
    key = _key(x, cast, args, kwargs)
    if key is None:
        return cast(x, *args, **kwargs)
    out = _find(site, key)
    if out is None:
        out = cast(x, *args, **kwargs)
        _keep(site, x, key, out)
    return out


def cast_shared_plan(site: str, plan, x: torch.Tensor):
    """:func:`cast_shared` of a cast plan (``mx_kernels.cast_plan``): ``plan(x)``, or the
    earlier result at ``site`` in the same scope from the same plan and tensor. The plan
    stands for the cast and all its arguments, so it keys in their place. Eager only,
    as its callers (the plans run only there).

    Args:
        site: the name the results are kept under.
        plan: the cast plan, called as ``plan(x)``.
        x: the tensor to cast.

    Returns:
        What ``plan(x)`` returns.
    """
    ident = _identity(x)
    if ident is None:
        return plan(x)
    key = (ident, plan)
    out = _find(site, key)
    if out is None:
        out = plan(x)
        _keep(site, x, key, out)
    return out


def peek_cast(site: str, cast, x: torch.Tensor, *args, **kwargs):
    """What ``cast_shared(site, cast, x, *args, **kwargs)`` would hand out without
    casting: nothing is cast or kept.

    Arguments as :func:`cast_shared`.

    Returns:
        The kept result, or None (always None under torch.compile).
    """
    if torch.compiler.is_compiling():
        return None
    if not _STATE.scopes:
        return None  # the common case, without building the key
    key = _key(x, cast, args, kwargs)
    return None if key is None else _find(site, key)


def prime_cast(site: str, cast, x: torch.Tensor, out, *args, **kwargs) -> None:
    """Make ``out`` what ``cast_shared(site, cast, x, *args, **kwargs)`` returns in the
    open scope while ``x`` is unchanged: a result of that cast known from elsewhere (an
    MX gather that made it). No-op outside a scope, under torch.compile and for
    inference tensors.

    Args:
        site, cast, x: as :func:`cast_shared`.
        out: the result to hand out.
        *args, **kwargs: the cast's other arguments, as the call will pass them.
    """
    if torch.compiler.is_compiling() or not _STATE.scopes:
        return
    key = _key(x, cast, args, kwargs)
    if key is not None:
        _keep(site, x, key, out)


@contextlib.contextmanager
def shared_casts() -> Iterator[None]:
    """A scope in which MXLinear layers reading the same input tensor share its casts
    (module doc). ``convert`` opens one around each call of a module with two or more
    MXLinear children; open one by hand around MXLinear layers called elsewhere."""
    _open(None)
    try:
        yield
    finally:
        _close(None)


def _open(owner) -> None:
    if not torch.compiler.is_compiling():
        _STATE.scopes.append((id(owner), {}))


def _close(owner) -> None:
    if torch.compiler.is_compiling():
        return
    scopes = _STATE.scopes
    for i in range(len(scopes) - 1, -1, -1):  # this owner's innermost scope and all above
        if scopes[i][0] == id(owner):
            del scopes[i:]
            return


def _pre_hook(module: nn.Module, args) -> None:
    _open(module)


def _post_hook(module: nn.Module, args, output) -> None:
    _close(module)


def add_cast_scope(module: nn.Module) -> None:
    """Give ``module`` a cast scope for each of its calls (module doc): opened before
    any other forward pre-hook (an MX gather's among them, whenever registered), closed
    after the forward, whether it returns or raises. Idempotent.

    Args:
        module: the module whose calls get a scope.
    """
    if getattr(module, _HOOKED, None) is None:
        handles = (
            module.register_forward_pre_hook(_pre_hook, prepend=True),
            module.register_forward_hook(_post_hook, always_call=True),
        )
        setattr(module, _HOOKED, handles)


@contextlib.contextmanager
def keep_weight_casts() -> Iterator[None]:
    """Inside, each MXLinear weight (a Parameter) is cast once and its casts reused while
    it is unchanged (same storage and version counter), for the micro-batches of one
    gradient-accumulation step; on exit every kept cast is dropped. Eager only. Write
    no weight inside other than in place (``.data`` writes are not seen); the optimizer
    step belongs outside. Not nested.

    Raises:
        RuntimeError: already open in this thread.
    """
    if _STATE.weights is not None:
        raise RuntimeError("keep_weight_casts() is already open in this thread")
    _STATE.weights = {}
    try:
        yield
    finally:
        _STATE.weights = None


def weight_casts_kept() -> bool:
    """Whether :func:`keep_weight_casts` is open.

    Returns:
        True inside it, in this thread.
    """
    return _STATE.weights is not None


def cast_weight_kept(cast, weight: torch.Tensor, *args, **kwargs):
    """``cast(weight, *args, **kwargs)``, kept inside :func:`keep_weight_casts` for a
    Parameter (a weight converted per call, as under autocast, is new each time).

    Args:
        cast: the cast function.
        weight: W [N, K].
        *args, **kwargs: the cast's other arguments (part of the key).

    Returns:
        What ``cast`` returns (the kept result while the weight is unchanged).
    """
    kept = _STATE.weights
    if kept is None or not isinstance(weight, nn.Parameter) or torch.compiler.is_compiling():
        return cast(weight, *args, **kwargs)
    key = _key(weight, cast, args, kwargs)
    if key is None:
        return cast(weight, *args, **kwargs)
    entry = kept.get(id(weight))
    if entry is not None and entry[0] == key:
        return entry[2]
    out = cast(weight, *args, **kwargs)
    kept[id(weight)] = (key, weight, out)
    return out
