"""The ``inline`` overloads of the fake-quantize ops (``torch.ops.mx.fake_quantize_*.inline``):
the same casts, which torch.compile allocates and launches from its own generated code.

Under torch.compile an op is a call from the generated code through the dispatcher into
the op's Python body (the plan lookup, the output allocations, the launch). At the
per-rank shapes of tensor parallelism that host time is what a compiled step waits for
(BENCHMARKS.md, 2026-12-05 'TP layer: where the step goes'). An ``inline`` overload is
replaced, while AOTAutograd functionalizes the graph, by its outputs' allocations and its
Triton kernel (``torch.library.wrap_triton``, as ``torch.library.triton_op`` does), so
Inductor launches the kernel itself: no dispatcher, no Python body.

The price: two inline casts of one tensor stay two kernels. Each launch gets its own
entry of constant arguments in the kernel side table and its own output allocations, so
the compiler's common-subexpression elimination never merges them
(``kernel_side_table.add_constant_args``, torch/_higher_order_ops/triton_kernel_wrap.py),
where it merges two calls of a default overload on one input. So a tensor that several
layers cast (X read by q, k and v) goes through the default overload, and a tensor cast
once (a weight, an output's gradient) through ``inline``.

Replaced only where the compiled kernel would run: a CUDA tensor whose cast resolves to
the Triton backend, not under ``TRITON_INTERPRET=1``, not under ``torch.export`` (which
keeps custom ops, as for ``triton_op``), no tensor subclass left to dispatch. Everywhere
else (CPU, the reference backend, eager code) an inline overload runs the default
overload's body.
``MX_KERNELS_INLINE=0``, read when a graph is traced, keeps every inline overload an op
(to rule the replacement out when something looks wrong, and for A/B timing:
``tools/bench/inline_ab.py``); a value other than ``0`` or ``1`` is an error there
(:mod:`mx_kernels.settings`).
"""

from __future__ import annotations

import torch

from mx_core import get_format
from mx_kernels.backend import interpreter_enabled, log_choice
from mx_kernels.cast_launch import launch_args
from mx_kernels.cast_plan import DIMS, choose
from mx_kernels.settings import inline_casts

__all__ = ["register_inline"]

_WHY = "inline: launched by torch.compile's generated code"


def register_inline(op: torch._ops.OpOverload, name: str) -> None:
    """Replace ``op`` by its kernel launch while AOTAutograd functionalizes a graph (see
    the module doc).

    Args:
        op: the inline overload of a fake-quantize op.
        name: that op's name (``"fake_quantize_rowwise"``, ...).
    """
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    def decompose(mode, func, types, args, kwargs):
        if any(not _known(t) for t in types):
            return NotImplemented  # a subclass (DTensor) dispatches first
        x, fmt, block_size, scale_mode, backend = args
        if not _replaced(name, x, block_size, backend):
            return mode.__torch_dispatch__(func, types, args, kwargs)
        with mode:
            return _launch(name, x, fmt, block_size, scale_mode)

    torch.library.register_torch_dispatch(op, FunctionalTensorMode, decompose)


def _known(t: type) -> bool:
    from torch._subclasses import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return issubclass(t, FakeTensor) or t in (torch.Tensor, FunctionalTensor)


def _replaced(name: str, x: torch.Tensor, block_size: int, backend: str) -> bool:
    """Whether the inline overload becomes its kernel launch here."""
    if x.device.type != "cuda" or interpreter_enabled() or _export_keeps_ops() or _off():
        return False  # (Triton's interpreter has no kernel for the compiler to launch)
    impl, _ = choose(name, backend, x, block_size, DIMS[name])  # the shape checks too
    if impl != "triton":
        return False
    log_choice(name, "triton", "cuda", _WHY)
    return True


def _off() -> bool:
    return not inline_casts()  # MX_KERNELS_INLINE, checked (mx_kernels.settings)


def _export_keeps_ops() -> bool:
    try:
        from torch.export._trace import custom_triton_ops_decomposition_disabled
    except ImportError:  # a torch without export's switch
        return False
    return custom_triton_ops_decomposition_disabled()


def _launch(name: str, x: torch.Tensor, fmt: str, block_size: int, scale_mode: str):
    """The op's outputs and its kernel's launch, traced (x a functional tensor; sizes
    may be symbolic): what the op body's plan does at run time
    (:mod:`mx_kernels.cast_plan`)."""
    from torch.library import wrap_triton

    k = x.shape[-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    rowwise, colwise = DIMS[name] != (0,), DIMS[name] != (-1,)
    row = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if rowwise else None
    col = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if colwise else None
    launcher, grid, ints = launch_args(
        tuple(x2.shape), tuple(x2.stride()), x.device, get_format(fmt), block_size, scale_mode,
        row, None, col, None, dequantized=True,
    )  # fmt: skip
    # The pointers of outputs a fake-quantize does not write (scales; one orientation)
    # are never read either: an output stands in, where a zero-size tensor would be one
    # more allocation per call.
    dummy = row if row is not None else col
    kernel = wrap_triton(launcher.kernel)
    kernel[grid](
        x2, dummy if row is None else row, dummy, dummy if col is None else col, dummy,
        *ints, **launcher.constexprs,
    )  # fmt: skip
    if row is not None and x.dim() != 2:
        row = row.view(x.shape)
    outs = [o for o in (row, col) if o is not None]
    return outs[0] if len(outs) == 1 else tuple(outs)
