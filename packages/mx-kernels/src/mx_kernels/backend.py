"""Kernel backend choice: every op says which implementation ran, and never falls back
silently.

``"auto"`` picks Triton for CUDA tensors and the pure-PyTorch reference elsewhere;
``"triton"`` forces Triton, which on CPU tensors needs ``TRITON_INTERPRET=1`` (how CI
tests the kernels); ``"reference"`` forces mx-core's reference. Each (op, backend,
device type, reason) choice is logged once at INFO on the ``mx_kernels`` logger.
"""

from __future__ import annotations

import functools
import logging

import torch

from mx_core import CastBackend, MatmulBackend
from mx_kernels.capability import auto_cublas_gap, cublas_mx_gap, device_capability, sm_name
from mx_kernels.settings import triton_interpret

__all__ = [
    "BACKENDS",
    "LOGGED",
    "MATMUL_BACKENDS",
    "TRITON_BLOCK_SIZES",
    "choose_backend",
    "interpreter_enabled",
    "log_choice",
    "persistent_programs",
    "resolve_backend",
    "resolve_backend_for",
    "resolve_matmul_backend",
    "triton_available",
]

logger = logging.getLogger("mx_kernels")

BACKENDS: tuple[str, ...] = CastBackend.choices()
"""Backends of the cast ops, ``("auto", "triton", "reference")`` (the matmul has its own
list)."""

MATMUL_BACKENDS: tuple[str, ...] = MatmulBackend.choices()
"""Backends of :func:`mx_kernels.scaled_mm`, ``("auto", "emulated", "cublas", "triton")``
(see :func:`resolve_matmul_backend`)."""


def interpreter_enabled() -> bool:
    """Whether Triton runs kernels on CPU tensors.

    Returns:
        True when ``TRITON_INTERPRET=1``, read as Triton reads it
        (:func:`mx_kernels.settings.triton_interpret`).
    """
    return triton_interpret()


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` works (checked once, lazily: never at import time).

    Returns:
        True when triton and its dependencies import.
    """
    return _triton_import_error() is None


@functools.cache
def _triton_import_error() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as e:  # not installed, or a dependency missing (the interpreter's numpy)
        return f"{type(e).__name__}: {e}"
    return None


def _no_triton(op: str, device_type: str, backend: str) -> RuntimeError:
    return RuntimeError(
        f"{op}: backend={backend!r} on {device_type} needs triton, which cannot be imported "
        f"({_triton_import_error()}); pass backend='reference' (casts) or 'emulated' (matmul)"
    )


def log_choice(op: str, backend: str, device_type: str, why: str) -> None:
    """Log at INFO, once per distinct choice and reason, which backend ``op`` runs.

    Args:
        op: the op's name.
        backend: the concrete backend that runs (``"triton"``, ``"reference"``...).
        device_type: the tensors' device type (``"cuda"``, ``"cpu"``).
        why: the reason, as the log line gives it; the four together key :data:`LOGGED`.
    """
    key = (op, backend, device_type, why)
    if key not in LOGGED:
        LOGGED.add(key)
        logger.info("mx_kernels.%s: %s backend on %s (%s)", op, backend, device_type, why)


LOGGED: set[tuple[str, str, str, str]] = set()
"""The ``(op, backend, device type, why)`` choices logged so far. The casts' plans test
their own against it on each call (a subset check, cheaper than a call per choice);
emptied, every choice is logged again."""


def resolve_backend(op: str, backend: str, device: torch.device, allowed=BACKENDS) -> str:
    """The concrete backend ``op`` runs for ``backend`` on ``device``, logged.

    Args:
        op: the op's name, for messages and the log.
        backend: the requested backend, one of ``allowed``.
        device: the tensors' device.
        allowed: the backends ``op`` takes (default :data:`BACKENDS`).
    Returns:
        ``"triton"`` or ``"reference"``.
    Raises:
        ValueError: ``backend`` is not in ``allowed``.
        RuntimeError: Triton was asked for (or is the auto choice on CUDA) but cannot run:
            triton cannot be imported, or the tensor is on CPU without ``TRITON_INTERPRET=1``.
    """
    if backend not in allowed:
        raise ValueError(f"{op}: backend={backend!r} is not one of {', '.join(allowed)}")
    impl, why = _resolve(op, backend, device, None)
    log_choice(op, impl, device.type, why)
    return impl


@functools.lru_cache(maxsize=1024)
def _choice(op: str, backend: str, device_type: str, gap: str | None, _interp: bool):
    """(backend, reason) without logging: cached, since every op body asks on its hot
    path (a choice that raises is not cached, and raises again)."""
    impl, why = _device_choice(op, backend, device_type)
    if impl != "triton" or gap is None:
        return impl, why
    if backend == "triton":
        raise ValueError(f"{op}: backend='triton' cannot run these arguments: {gap}")
    return "reference", gap


def _device_choice(op: str, backend: str, device_type: str) -> tuple[str, str]:
    if backend == "reference":
        return "reference", "requested"
    if backend == "auto" and device_type != "cuda":
        return "reference", "auto: not a CUDA tensor"
    if not triton_available():
        raise _no_triton(op, device_type, backend)
    if device_type != "cuda" and not interpreter_enabled():
        raise RuntimeError(
            f"{op}: backend='triton' on a {device_type} tensor needs TRITON_INTERPRET=1 "
            "(Triton's interpreter); use a CUDA tensor or backend='reference'"
        )
    return "triton", backend


TRITON_BLOCK_SIZES: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128)
"""Block sizes the Triton casts and dequantize handle."""


def resolve_backend_for(op: str, backend: str, device: torch.device, gap: str | None) -> str:
    """:func:`resolve_backend`, then the reference where Triton cannot run these
    arguments (``gap`` says why; None: it can): logged for ``"auto"``, a ValueError for
    ``"triton"``.

    Args:
        op, backend, device: as :func:`resolve_backend` (``backend`` one of
            :data:`BACKENDS`).
        gap: why Triton cannot run these arguments, or None.
    Returns:
        ``"triton"`` or ``"reference"``.
    Raises:
        ValueError, RuntimeError: as :func:`choose_backend`.
    """
    impl, why = choose_backend(op, backend, device, gap)
    log_choice(op, impl, device.type, why)
    return impl


def choose_backend(op: str, backend: str, device: torch.device, gap: str | None) -> tuple[str, str]:
    """:func:`resolve_backend_for`'s choice and its reason, without logging it (the
    casts' plans log it on each call, once per process: :func:`log_choice`).

    Args:
        op, backend, device, gap: as :func:`resolve_backend_for`.
    Returns:
        ``(backend, why)``: ``"triton"`` or ``"reference"``, and the reason to log.
    Raises:
        ValueError: ``backend`` is not in :data:`BACKENDS`; or ``backend="triton"`` with
            ``gap`` set.
        RuntimeError: Triton was asked for (or is the auto choice on CUDA) but cannot run:
            triton cannot be imported, or the tensor is on CPU without ``TRITON_INTERPRET=1``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend={backend!r} is not one of {', '.join(BACKENDS)}")
    return _resolve(op, backend, device, gap)


def _resolve(op: str, backend: str, device: torch.device, gap: str | None) -> tuple[str, str]:
    device_type = device.type
    # TRITON_INTERPRET only matters off CUDA (reading it costs ~0.15 us: mx_kernels.settings).
    interp = device_type != "cuda" and interpreter_enabled()
    return _choice(op, backend, device_type, gap, interp)


def persistent_programs(device: torch.device, per_sm: int = 1) -> int:
    """Programs of a persistent grid.

    Args:
        device: the tensors' device.
        per_sm: programs per streaming multiprocessor on CUDA.
    Returns:
        ``per_sm`` times the SM count on CUDA; 2 elsewhere (the interpreter), fewer than
        tiles, so the kernels' tile loops are exercised.
    """
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count * per_sm
    return 2


def resolve_matmul_backend(
    op: str,
    backend: str,
    device: torch.device,
    *,
    cublas_unsupported: str | None = None,
    fp4: bool = False,
    log: bool = True,
) -> str:
    """The concrete matmul backend for ``backend`` on ``device``.

    ``"auto"`` picks ``"emulated"`` off CUDA; ``"cublas"`` where the device is one
    :data:`mx_kernels.capability.AUTO_CUBLAS` names (sm100, sm103), PyTorch's cuBLAS MX
    GEMM runs there (:func:`mx_kernels.capability.cublas_mx_gap`) and
    ``cublas_unsupported`` (why cuBLAS cannot take these arguments) is None; else
    ``"triton"``, logged with the reason. ``fp4``: the operands are MXFP4 (another
    entry point and other capability rules than MXFP8). ``log=False`` asks without
    logging a choice (nothing runs).

    Args:
        op: the op's name, for messages and the log.
        backend: one of :data:`MATMUL_BACKENDS`.
        device: the operands' device.
        cublas_unsupported: why cuBLAS does not take these operands, or None.
        fp4: the operands are MXFP4.
        log: log the choice (once per distinct choice: :func:`log_choice`).
    Returns:
        ``"emulated"``, ``"cublas"`` or ``"triton"``.
    Raises:
        ValueError: ``backend`` is not in :data:`MATMUL_BACKENDS`; or
            ``backend="cublas"`` with ``cublas_unsupported`` set (the message says why).
        RuntimeError: the backend cannot run here: ``"cublas"`` where PyTorch's cuBLAS MX
            GEMM cannot (the message names the capability, the API or the build feature
            missing); Triton needs triton and sm90+ (or, on CPU, ``TRITON_INTERPRET=1``).
    """
    if backend not in MATMUL_BACKENDS:
        raise ValueError(f"{op}: backend={backend!r} is not one of {', '.join(MATMUL_BACKENDS)}")
    _log = log_choice if log else lambda *args: None
    if backend == "emulated" or (backend == "auto" and device.type != "cuda"):
        _log(op, "emulated", device.type, backend if backend != "auto" else "auto: not CUDA")
        return "emulated"
    capability = device_capability(device)
    where = sm_name(capability) if capability else f"a {device.type} tensor"
    device_gap = cublas_mx_gap(capability, fp4=fp4, where=where)
    why = backend
    if backend == "auto":
        gap = device_gap or auto_cublas_gap(capability) or cublas_unsupported
        if gap is None:
            entry = "MXFP4, torch.nn.functional.scaled_mm" if fp4 else "MXFP8, torch._scaled_mm"
            _log(op, "cublas", device.type, f"auto: {where}, {entry}")
            return "cublas"
        backend, why = "triton", f"auto: {gap}"
    if backend == "cublas":
        if device_gap is not None:
            raise RuntimeError(
                f"{op}: backend='cublas' (cuBLAS MX block scaling) cannot run: {device_gap}; "
                "use backend='triton' or 'emulated'"
            )
        if cublas_unsupported is not None:
            raise ValueError(
                f"{op}: backend='cublas' cannot run these arguments: {cublas_unsupported}; "
                "use backend='auto' (which routes them to Triton), 'triton' or 'emulated'"
            )
        _log(op, "cublas", device.type, why)
        return "cublas"
    if capability is not None and capability < (9, 0):
        raise RuntimeError(
            f"{op}: the Triton MX matmul needs compute capability >= 9.0, got {where} "
            f"(backend={backend!r}); pass backend='emulated'"
        )
    if capability is None and not interpreter_enabled():
        raise RuntimeError(
            f"{op}: backend='triton' on {where} needs TRITON_INTERPRET=1 (Triton's "
            "interpreter); use a CUDA tensor or backend='emulated'"
        )
    if not triton_available():
        raise _no_triton(op, device.type, backend)
    _log(op, "triton", device.type, why)
    return "triton"
