"""Test helpers: the cached launch path of :mod:`mx_kernels.launch`, which only CUDA
tensors take, run on CPU; and a count of the casts that run.

Under :func:`cpu_cached_launches`, CPU tensors go through the launch cache as CUDA
tensors do, with a stand-in for Triton's compiled kernel: the first launch of each
specialization goes through Triton's JIT (the interpreter), every later one through
the stand-in's ``run``, called exactly as a compiled kernel's launcher is. The stand-in
checks that the arguments have the specialization it was "compiled" for (1-byte tensors
counted as uint8: a compiled launcher reads only data pointers), then runs the kernel
in the interpreter on them, so the cached path's results can be compared bit for bit.
With ``interpret=False`` no launch runs a kernel, the first neither (the host-cost
benchmark's stub launch: outputs stay uninitialised).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import torch

from mx_kernels import cast_launch, cast_plan, launch
from mx_kernels.launch import KernelLauncher, specialization_key

__all__ = ["counting_casts", "cpu_cached_launches"]


class _StandIn:
    """What the launch cache keeps of a compiled kernel, for the interpreter."""

    def __init__(self, launcher: KernelLauncher, key: tuple, interpret: bool, counts) -> None:
        self.launcher, self.key, self.counts = launcher, key, counts
        self.function, self.packed_metadata = object(), object()
        self.run = self._run if interpret else _no_launch

    def _run(self, gx, gy, gz, stream, function, metadata, launch_meta, enter, exit_, *args):
        launcher = self.launcher
        if function is not self.function or metadata is not self.packed_metadata:
            raise AssertionError("launched with another kernel's function or metadata")
        runtime, tail = args[: launcher.n_runtime], args[launcher.n_runtime :]
        if tail != launcher.tail:
            raise AssertionError(f"constexprs {tail}, compiled with {launcher.tail}")
        runtime = [_as_jit(a) for a in runtime]
        key = specialization_key(runtime, launcher.tensors)
        if key != self.key:
            raise AssertionError(f"kernel compiled for {self.key} launched with {key}")
        self.counts["cached"] += 1
        launcher.kernel[(gx, gy, gz)](*runtime, **launcher.constexprs)


def _no_launch(*args) -> None:
    pass


def _as_jit(arg):
    one_byte = isinstance(arg, torch.Tensor) and arg.element_size() == 1
    return arg.view(torch.uint8) if one_byte and arg.dtype != torch.uint8 else arg


@contextlib.contextmanager
def cpu_cached_launches(interpret: bool = True) -> Iterator[collections.Counter]:
    """Within, CPU tensors take the cached launch path (see the module doc); yields the
    counts of launches: ``"compiled"`` (through the JIT, each new specialization) and
    ``"cached"`` (through the stand-in, counted with ``interpret`` only). Needs
    ``TRITON_INTERPRET=1``. Cast plans and launchers made before or inside are dropped
    on entry and on exit.

    Args:
        interpret: run each cached launch's kernel in Triton's interpreter (and count
            it); False makes it a no-op (host cost alone).
    """
    counts: collections.Counter = collections.Counter()

    def compile_(self: KernelLauncher, grid, args) -> tuple:
        if interpret:
            self.kernel[grid](*args, **self.constexprs)  # the JIT's own first launch
        counts["compiled"] += 1
        key = specialization_key(args, self.tensors)
        stand_in = _StandIn(self, key, interpret, counts)
        return (stand_in.run, stand_in.function, stand_in.packed_metadata, stand_in, key)

    def check(self: KernelLauncher, entry: tuple, grid, jit_args) -> None:
        # Triton's JIT would pick the kernel of the arguments' specialization
        if specialization_key(jit_args, self.tensors) != entry[4]:
            raise RuntimeError(
                f"KernelLauncher: cached kernel differs from Triton's for {tuple(jit_args)}"
            )

    saved = (KernelLauncher.cached_devices, KernelLauncher.compile, KernelLauncher.check)
    saved_stream = launch.current_stream
    _drop_plans()
    KernelLauncher.cached_devices = (*saved[0], "cpu")
    KernelLauncher.compile, KernelLauncher.check = compile_, check
    launch.current_stream = lambda: 0
    try:
        yield counts
    finally:
        KernelLauncher.cached_devices, KernelLauncher.compile, KernelLauncher.check = saved
        launch.current_stream = saved_stream
        _drop_plans()


@contextlib.contextmanager
def counting_casts() -> Iterator[list[tuple[str, tuple[int, ...]]]]:
    """Within, every cast that runs appends ``(op name, input shape)`` to the yielded
    list, however it was reached: a public function, a ``torch.ops.mx`` op or a caller
    holding the cast's plan (every one runs a :class:`mx_kernels.cast_plan.CastPlan`)."""
    calls: list[tuple[str, tuple[int, ...]]] = []
    run = cast_plan.CastPlan.__call__

    def counted(plan, x):
        calls.append((plan.logs[0][0], tuple(x.shape)))
        return run(plan, x)

    cast_plan.CastPlan.__call__ = counted
    try:
        yield calls
    finally:
        cast_plan.CastPlan.__call__ = run


def _drop_plans() -> None:
    cast_plan.clear_plans()
    cast_launch.launch_config.cache_clear()
