"""How the ``mx::`` ops are registered: ``torch.library.Library`` ``define`` and
``impl``, plus ``register_fake``.

Not ``torch.library.custom_op``: its Python layers around the kernel (an autograd
wrapper, and checks that no output aliases an input or another output) took about 60 of
the 85 us that ``mx::quantize_rowwise`` cost per call on the H200 host, where an op
defined through ``Library`` dispatches in 3 us (BENCHMARKS.md, 2026-12-03 'Host cost per
op'). The ops are the same to everything that uses them: one schema each, a fake
(meta) implementation for FakeTensor and torch.compile, ``opcheck`` in the tests, and
DTensor sharding rules registered against the ``OpOverload`` (mx-dtensor). None of the
ops is differentiable (casts, a dequantize and a GEMM used inside autograd.Functions),
so none registers autograd.

The public functions call an op's implementation directly where nothing but the
kernel would see the op (:func:`may_skip_dispatch`): the dispatcher's own cost, 8 us
per call on the H200 host, is then saved in eager code on plain tensors. Everything
that must see the op still does: tensor subclasses (DTensor, FakeTensor, functional
tensors), dispatch and function modes (CommDebugMode, FakeTensorMode), torch.compile's
tracing, the profiler, and inputs that require grad.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["define_op", "may_skip_dispatch"]

_LIB = torch.library.Library("mx", "FRAGMENT")


def define_op(schema: str, impl: Callable, fake: Callable) -> torch._ops.OpOverload:
    """Define ``mx::<schema>`` with ``impl`` for every backend and ``fake`` for meta
    and fake tensors.

    Args:
        schema: the op's schema without the namespace (``"name.overload(...) -> ..."``).
        impl: the op's body, one function for every backend.
        fake: the op's meta/fake function: output shapes and dtypes only.

    Returns:
        ``torch.ops.mx.<name>.<overload>`` (``default`` where the schema's name has no
        ``.overload``).
    """
    name = schema.split("(", 1)[0]
    _LIB.define(schema, tags=(torch.Tag.pt2_compliant_tag,))
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"mx::{name}", fake, lib=_LIB)
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.mx, base), overload or "default")


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def may_skip_dispatch(x: torch.Tensor) -> bool:
    """Whether calling an op's implementation on ``x`` directly is indistinguishable from
    calling the op (see the module doc).

    Args:
        x: the op's tensor input.

    Returns:
        True for a plain tensor (or Parameter) needing no grad, outside torch.compile,
        dispatch modes, torch-function modes and the profiler.
    """
    return (
        not torch.compiler.is_compiling()
        and type(x) in _PLAIN
        and not (x.requires_grad and torch.is_grad_enabled())
        and not torch._C._len_torch_dispatch_stack()
        and not torch._C._len_torch_function_stack()
        and not torch._C._autograd._profiler_enabled()
    )
