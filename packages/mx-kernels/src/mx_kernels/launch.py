"""A cached launch path for Triton kernels whose constexprs are fixed per configuration.

``kernel[grid](*args, **constexprs)`` binds and specializes every argument on every
call: 27 us per cast on the H200 host, against 6 us for launching the same compiled
kernel directly (BENCHMARKS.md, 2026-12-03 'Host cost per op'). :class:`KernelLauncher`
keeps the compiled kernels of one (kernel, constexprs) configuration, keyed by each
tensor argument's dtype and 16-byte alignment and each int argument's value (a superset
of what Triton specializes on, so a cached kernel is never reused for arguments it was
not compiled for), and launches a hit through the compiled kernel's own launcher.
:class:`PreparedLaunch` goes further for callers whose grid and ints are fixed (the
casts' plans, :mod:`mx_kernels.cast_plan`): one dict lookup on the first tensor's
alignment, then the launch.

The first call of each key, every call under ``TRITON_INTERPRET=1`` (CPU tensors) and
every call while a Triton launch hook is set (profilers) take Triton's own JIT path.
``MX_KERNELS_CACHED_LAUNCH=0`` sends every launch through Triton's JIT (to rule the
cache out when something looks wrong); ``MX_KERNELS_CHECK_LAUNCH=1`` checks, on every
cached launch, that Triton's JIT would have picked the same compiled kernel (the GPU
benchmarks' ``--check``). Both are read on every launch that could take the cache, once
each (:mod:`mx_kernels.settings`: about 0.09 us a read). :mod:`mx_kernels.testing`
runs the cached path on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mx_kernels import settings

__all__ = ["KernelLauncher", "PreparedLaunch", "current_stream", "specialization_key"]


def specialization_key(args: Sequence, tensors: int) -> tuple:
    """The cache key of a launch's runtime arguments.

    Args:
        args: the runtime arguments, ``tensors`` tensors first, then ints.
        tensors: how many of them are tensors.

    Returns:
        (dtype, data_ptr mod 16) per tensor, then the ints themselves, as one tuple.
    """
    return (*[(a.dtype, a.data_ptr() & 15) for a in args[:tensors]], *args[tensors:])


class KernelLauncher:
    """Launch ``kernel`` with fixed ``constexprs`` (launch options such as
    ``num_warps`` included) on runtime ``args`` given positionally, in the kernel's
    parameter order: ``tensors`` tensors first, then ints. The constexprs must be the
    kernel's last parameters."""

    MAX_ENTRIES = 1024  # distinct shapes kept per configuration before starting afresh
    # Device types whose launches go through the cache (Triton's compiled launchers are
    # CUDA's; mx_kernels.testing adds "cpu" with a stand-in compiled kernel).
    cached_devices: tuple[str, ...] = ("cuda",)

    def __init__(self, kernel, constexprs: dict, tensors: int) -> None:
        self.kernel = kernel
        self.constexprs = dict(constexprs)
        names = list(kernel.arg_names)
        tail = [n for n in names if n in constexprs]
        if names[len(names) - len(tail) :] != tail:
            raise ValueError(f"KernelLauncher: {kernel}'s constexprs must come last: {names}")
        self.n_runtime = len(names) - len(tail)
        self.tensors = tensors
        # The constexprs' values in parameter order: a compiled kernel's launcher takes
        # them after the runtime arguments.
        self.tail = tuple(constexprs[n] for n in tail)
        self._compiled: dict[tuple, tuple] = {}  # specialization key -> compile()'s entry
        from triton import knobs  # here, not at import: importing mx_kernels needs no triton

        self._runtime = knobs.runtime

    def caches(self, device_type: str) -> bool:
        """Whether launches on tensors of ``device_type`` go through the cache now."""
        return device_type in self.cached_devices and _read_cached()

    def hooked(self) -> bool:
        """Whether a Triton launch hook is set (then every launch takes Triton's path)."""
        rt = self._runtime
        return _hooked(rt.launch_enter_hook) or _hooked(rt.launch_exit_hook)

    def __call__(self, grid: tuple[int, ...], *args) -> None:
        if len(args) != self.n_runtime:
            raise TypeError(f"KernelLauncher: {self.n_runtime} runtime arguments, got {len(args)}")
        x = args[0]
        if not (isinstance(x, torch.Tensor) and self.caches(x.device.type)) or self.hooked():
            self.kernel[grid](*args, **self.constexprs)
            return
        key = specialization_key(args, self.tensors)
        entry = self._compiled.get(key)
        if entry is None:
            if len(self._compiled) >= self.MAX_ENTRIES:
                self._compiled.clear()
            self._compiled[key] = self.compile(grid, args)
            return
        self.run(entry, (*grid, 1, 1), grid, args, args)

    def compile(self, grid: tuple[int, ...], args: Sequence) -> tuple:
        """Launch through Triton's JIT (compiling on its first sight of these arguments'
        specialization); returns the cache entry of the compiled kernel: its launcher,
        function handle, packed metadata, the kernel itself and its specialization key."""
        compiled = self.kernel[grid](*args, **self.constexprs)
        compiled._init_handles()
        key = specialization_key(args, self.tensors)
        return (compiled.run, compiled.function, compiled.packed_metadata, compiled, key)

    def run(self, entry: tuple, grid3: tuple, grid, args: Sequence, jit_args: Sequence) -> None:
        """Launch the compiled kernel of ``entry`` (:meth:`compile`) on ``args``;
        ``jit_args`` are the same arguments as Triton's JIT takes them (for the check)."""
        if _read_check():
            self.check(entry, grid, jit_args)
        run, function, metadata, _, _ = entry
        run(*grid3[:3], current_stream(), function, metadata, None, None, None, *args, *self.tail)

    def check(self, entry: tuple, grid, jit_args: Sequence) -> None:
        """Raise unless Triton's JIT picks the compiled kernel of ``entry`` for ``jit_args``."""
        compiled = entry[3]
        jit = self.kernel.warmup(*jit_args, grid=grid, **self.constexprs)
        if jit is not compiled and jit.asm != compiled.asm:
            raise RuntimeError(
                f"KernelLauncher: cached kernel differs from Triton's for {tuple(jit_args)}"
            )


class PreparedLaunch:
    """Launches of one :class:`KernelLauncher` at a fixed grid and fixed int arguments,
    on tensors of fixed dtypes (Triton's JIT sees each as ``jit_dtypes`` gives, by a
    view; None: as it is) whose alignment is fixed except the first's: the caller
    passes tensors it allocated itself (16-byte aligned, as torch's allocators give)
    after the first. A call costs a dict lookup on the first tensor's alignment, then
    the compiled kernel's own launch; with ``MX_KERNELS_CHECK_LAUNCH=1`` the check of
    :class:`KernelLauncher` also confirms the specialization key the cache assumed."""

    __slots__ = ("launcher", "grid", "ints", "cacheable", "_grid3", "_tail", "_views", "_compiled")

    def __init__(
        self, launcher: KernelLauncher, grid: tuple[int, ...], ints: tuple[int, ...],
        device_type: str, jit_dtypes: tuple,
    ) -> None:  # fmt: skip
        if len(jit_dtypes) + len(ints) != launcher.n_runtime:
            raise TypeError(
                f"PreparedLaunch: {launcher.n_runtime} runtime arguments, "
                f"got {len(jit_dtypes)} tensors and {len(ints)} ints"
            )
        self.launcher = launcher
        self.grid = grid
        self.ints = ints
        self.cacheable = device_type in launcher.cached_devices  # and the switch, per call
        self._grid3 = (*grid, 1, 1)[:3]
        self._tail = (*ints, *launcher.tail)
        self._views = jit_dtypes
        self._compiled: dict[int, tuple] = {}  # first tensor's data_ptr % 16 -> entry

    def __call__(self, *tensors: torch.Tensor) -> None:
        # The switches read inline (no frames of helpers): this is every cast's path.
        cached = self.cacheable and _read_cached() and not self.launcher.hooked()
        if cached:
            entry = self._compiled.get(tensors[0].data_ptr() & 15)
            if entry is not None:
                if _read_check():
                    self._check(entry, tensors)
                run, function, metadata, _, _ = entry
                g = self._grid3
                run(g[0], g[1], g[2], current_stream(), function, metadata, None, None, None,
                    *tensors, *self._tail)  # fmt: skip
                return
        args = (*self.jit_tensors(tensors), *self.ints)
        if cached:
            self._compiled[tensors[0].data_ptr() & 15] = self.launcher.compile(self.grid, args)
        else:
            self.launcher.kernel[self.grid](*args, **self.launcher.constexprs)

    def jit_tensors(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` as Triton's JIT takes them (viewed as ``jit_dtypes``)."""
        views = zip(tensors, self._views, strict=True)
        return [t if d is None or t.dtype == d else t.view(d) for t, d in views]

    def _check(self, entry: tuple, tensors: Sequence[torch.Tensor]) -> None:
        args = (*self.jit_tensors(tensors), *self.ints)
        key = specialization_key(args, len(tensors))
        if key != entry[4]:
            raise RuntimeError(f"PreparedLaunch: the kernel compiled for {entry[4]} got {key}")
        self.launcher.check(entry, self.grid, args)


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is set: None or, in newer Triton, an empty chain
    (``knobs.HookChain``) when not."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _bind_current_stream() -> int:
    """The current CUDA stream's handle, as Triton's JIT launches on it (its driver's
    ``get_current_stream(get_current_device())``), without ``torch.cuda.current_device``'s
    Python lazy-init check: a launch reaches here only after a CUDA tensor exists. Binds
    :data:`current_stream` to the getter it builds, so that only the first call imports
    and looks up.

    Returns:
        The stream's handle, an int.
    """
    global current_stream
    from triton.runtime import driver

    active = driver.active
    device = getattr(torch._C, "_cuda_getDevice", active.get_current_device)
    get_stream = active.get_current_stream

    def stream() -> int:
        """The current CUDA stream's handle, as Triton's JIT launches on it.

        Returns:
            The stream's handle, an int.
        """
        return get_stream(device())

    current_stream = stream
    return stream()


current_stream = _bind_current_stream
"""``() -> int``: the handle of the stream a cached launch goes on, looked up as a module
attribute on each launch (so :mod:`mx_kernels.testing` can stand in for it on CPU);
replaced by the bound getter on first use."""

# MX_KERNELS_CACHED_LAUNCH and MX_KERNELS_CHECK_LAUNCH, read on each launch.
_read_cached, _read_check = settings.cached_launch, settings.check_launch
