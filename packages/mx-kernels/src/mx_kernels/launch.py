"""A cached launch path for Triton kernels whose constexprs are fixed per configuration.

``kernel[grid](*args, **constexprs)`` binds and specializes every argument on every
call: 27 us per cast on the H200 host, against 6 us for launching the same compiled
kernel directly (BENCHMARKS.md, 2026-12-03 'Host cost per op'). :class:`KernelLauncher`
keeps the compiled kernels of one (kernel, constexprs) configuration, keyed by each
tensor argument's dtype and 16-byte alignment and each int argument's value (a superset
of what Triton specializes on, so a cached kernel is never reused for arguments it was
not compiled for), and launches a hit through the compiled kernel's own launcher.

The first call of each key, every call under ``TRITON_INTERPRET=1`` (CPU tensors) and
every call while a Triton launch hook is set (profilers) take Triton's own JIT path.
``MX_KERNELS_CACHED_LAUNCH=0`` sends every launch through Triton's JIT (to rule the
cache out when something looks wrong); ``MX_KERNELS_CHECK_LAUNCH=1`` checks, on every
cached launch, that Triton's JIT would have picked the same compiled kernel (the GPU
benchmarks' ``--check``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

__all__ = ["KernelLauncher", "specialization_key"]


def specialization_key(args: Sequence, tensors: int) -> tuple:
    """The cache key of runtime ``args`` whose first ``tensors`` are tensors and the
    rest ints: (dtype, data_ptr mod 16) per tensor, then the ints themselves."""
    return (*[(a.dtype, a.data_ptr() & 15) for a in args[:tensors]], *args[tensors:])


class KernelLauncher:
    """Launch ``kernel`` with fixed ``constexprs`` (launch options such as
    ``num_warps`` included) on runtime ``args`` given positionally, in the kernel's
    parameter order: ``tensors`` tensors first, then ints. The constexprs must be the
    kernel's last parameters."""

    MAX_ENTRIES = 1024  # distinct shapes kept per configuration before starting afresh

    def __init__(self, kernel, constexprs: dict, tensors: int) -> None:
        self.kernel = kernel
        self.constexprs = dict(constexprs)
        names = list(kernel.arg_names)
        tail = [n for n in names if n in constexprs]
        if names[len(names) - len(tail) :] != tail:
            raise ValueError(f"KernelLauncher: {kernel}'s constexprs must come last: {names}")
        self.n_runtime = len(names) - len(tail)
        self.tensors = tensors
        self._tail = tuple(constexprs[n] for n in tail)
        self._compiled: dict[tuple, object] = {}
        from triton import knobs  # here, not at import: importing mx_kernels needs no triton

        self._runtime = knobs.runtime
        self._driver = None  # triton's active driver, once a CUDA launch needs it

    def __call__(self, grid: tuple[int, ...], *args) -> None:
        if len(args) != self.n_runtime:
            raise TypeError(f"KernelLauncher: {self.n_runtime} runtime arguments, got {len(args)}")
        hooked = _hooked(self._runtime.launch_enter_hook) or _hooked(self._runtime.launch_exit_hook)
        cuda = isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda"
        if hooked or not cuda or not _CACHED:
            self.kernel[grid](*args, **self.constexprs)
            return
        key = specialization_key(args, self.tensors)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **self.constexprs)
            compiled._init_handles()
            if len(self._compiled) >= self.MAX_ENTRIES:
                self._compiled.clear()
            self._compiled[key] = compiled
            return
        if _CHECK:
            self._check(compiled, grid, args)
        if self._driver is None:
            from triton.runtime import driver

            self._driver = driver.active
        stream = self._driver.get_current_stream(self._driver.get_current_device())
        g = (*grid, 1, 1)
        compiled.run(
            g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata,
            None, None, None, *args, *self._tail,
        )  # fmt: skip

    def _check(self, compiled, grid, args) -> None:
        jit = self.kernel.warmup(*args, grid=grid, **self.constexprs)
        if jit is not compiled and jit.asm != compiled.asm:
            raise RuntimeError(f"KernelLauncher: cached kernel differs from Triton's for {args}")


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is set: None or, in newer Triton, an empty chain
    (``knobs.HookChain``) when not."""
    return hook is not None and bool(getattr(hook, "calls", True))


_CACHED = os.environ.get("MX_KERNELS_CACHED_LAUNCH", "1") not in ("", "0")
_CHECK = os.environ.get("MX_KERNELS_CHECK_LAUNCH", "0") not in ("", "0")
