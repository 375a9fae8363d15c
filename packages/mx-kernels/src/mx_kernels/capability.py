"""What PyTorch's cuBLAS MX GEMM can run on a CUDA device, per capability family, and what
``scaled_mm``'s ``"auto"`` backend sends there: the one place these rules live.

- sm90 and below: no block-scaled MMA; ``"auto"`` runs Triton.
- sm100, sm103 (major 10; B200/GB200, B300/GB300): MXFP8 through ``torch._scaled_mm``,
  MXFP4 through ``torch.nn.functional.scaled_mm`` (a torch built with MSLK, formerly
  FBGEMM_GENAI); ``"auto"`` runs cuBLAS, the parts PyTorch's MX tests target.
- sm101 (Thor under CUDA 12), sm110 (Thor): PyTorch takes MXFP8 (block-wise 1x32
  scaling asks for major >= 10) and MXFP4 only on major 10; neither is tested there, so
  ``"auto"`` runs Triton (logged with the reason).
- sm120, sm121 (RTX Blackwell, DGX Spark): PyTorch takes MXFP8 but refuses MXFP4
  (``_check_mxfp4_support`` asks for major 10; PyTorch's tests skip MXFP4 there), and
  cuBLAS before 13.6 takes only TN MXFP8 there (pytorch#198126); ``"auto"`` runs Triton
  (logged with the reason).

"Takes" is what PyTorch's own checks let through (``ScaledBlas.cpp``, whose CUDA source
is not installed with torch: the rules above as this project reads them;
``torch.testing._internal.common_cuda``: ``PLATFORM_SUPPORTS_MX_GEMM`` is sm100 or
later, ``IS_SM10X``/``IS_SM12X`` gate per family). ``"auto"`` picks cuBLAS only where it
is known to work (sm100, sm103); an explicit ``backend="cublas"`` runs wherever PyTorch
takes it, and elsewhere raises naming what is missing. The torch side is found by
feature detection (does ``torch.nn.functional.scaled_mm`` with ``BlockWise1x32`` and
``SWIZZLE_32_4_4`` exist; does the build say MSLK or FBGEMM_GENAI), never by version.

The device's capability is asked once per process and device index.
"""

from __future__ import annotations

import functools
import re

import torch

__all__ = [
    "AUTO_CUBLAS",
    "auto_cublas_gap",
    "blockwise_api_gap",
    "cublas_mx_gap",
    "cuda_capability",
    "device_capability",
    "mxfp4_build_gap",
    "sm_name",
]

AUTO_CUBLAS: frozenset[tuple[int, int]] = frozenset({(10, 0), (10, 3)})
"""Capabilities where ``"auto"`` runs the cuBLAS MX GEMM: B200/GB200 (sm100) and
B300/GB300 (sm103), the parts PyTorch's MX tests target."""


@functools.cache
def cuda_capability(index: int) -> tuple[int, int]:
    """``torch.cuda.get_device_capability`` of CUDA device ``index``, asked once per
    process and index (``cuda_capability.cache_clear()`` forgets).

    Args:
        index: the CUDA device's index.
    Returns:
        ``(major, minor)``.
    """
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of a device.

    Args:
        device: a CUDA device (its index, else the current device's) or any other.
    Returns:
        ``(major, minor)`` (:func:`cuda_capability`); None for a device that is not CUDA.
    """
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return cuda_capability(index)


def sm_name(capability: tuple[int, int]) -> str:
    """How messages name a capability.

    Args:
        capability: ``(major, minor)``.
    Returns:
        ``"sm100"`` for ``(10, 0)``.
    """
    return f"sm{capability[0]}{capability[1]}"


def blockwise_api_gap() -> str | None:
    """Whether this torch has ``torch.nn.functional.scaled_mm`` with MX (BlockWise1x32,
    SWIZZLE_32_4_4) scales, the entry point of MXFP4 GEMMs (feature detection).

    Returns:
        What is missing, or None where it has all of it.
    """
    functional = torch.nn.functional
    if not hasattr(functional, "scaled_mm"):
        return "this torch has no torch.nn.functional.scaled_mm"
    scaling = getattr(functional, "ScalingType", None)
    swizzle = getattr(functional, "SwizzleType", None)
    if scaling is None or not hasattr(scaling, "BlockWise1x32"):
        return "this torch's torch.nn.functional.ScalingType has no BlockWise1x32"
    if swizzle is None or not hasattr(swizzle, "SWIZZLE_32_4_4"):
        return "this torch's torch.nn.functional.SwizzleType has no SWIZZLE_32_4_4"
    return None


@functools.cache
def mxfp4_build_gap() -> str | None:
    """Whether this torch build can run MXFP4 GEMMs on CUDA: PyTorch runs them through
    MSLK (formerly FBGEMM_GENAI), compiled in only where the build says so in
    ``torch.__config__.show()`` (read once; ``mxfp4_build_gap.cache_clear()`` forgets).

    Returns:
        Why it cannot, or None where it can.
    """
    flags = _build_flags(torch.__config__.show())
    if flags.get("USE_MSLK") or flags.get("USE_FBGEMM_GENAI"):
        return None
    return "this torch build has neither USE_MSLK nor USE_FBGEMM_GENAI (torch.__config__.show())"


def _build_flags(config: str) -> dict[str, bool]:
    """``USE_X`` switches of a ``torch.__config__.show()`` text: ``USE_X=ON`` / ``=1``
    (or a ``-DUSE_X`` compiler flag) is on, ``=OFF`` / ``=0`` off."""
    flags: dict[str, bool] = {}
    for name in re.findall(r"-D(USE_[A-Z0-9_]+)\b", config):
        flags[name] = True
    for name, value in re.findall(r"\b(USE_[A-Z0-9_]+)=([A-Za-z0-9]*)", config):
        flags[name] = value.upper() in ("ON", "1", "TRUE", "YES")
    return flags


def cublas_mx_gap(capability: tuple[int, int] | None, *, fp4: bool, where: str) -> str | None:
    """Why PyTorch's cuBLAS MX GEMM cannot run on this device (None where it can).

    Args:
        capability: the device's compute capability; None: not a CUDA device.
        fp4: MXFP4 operands (``torch.nn.functional.scaled_mm``) rather than MXFP8
            (``torch._scaled_mm``).
        where: the device, for the message ("a cpu tensor").
    Returns:
        What is missing: the capability, the API or the build feature.
    """
    if capability is None:
        return f"the cuBLAS MX GEMM needs a CUDA device of compute capability 10.x, got {where}"
    name = sm_name(capability)
    if capability[0] < 10:
        return (
            f"{name} has no block-scaled MMA: the cuBLAS MX GEMM needs compute capability "
            "10.x (sm100, sm103)"
        )
    if not fp4:
        return None
    if capability[0] != 10:
        return (
            f"MXFP4 on {name}: PyTorch's MXFP4 GEMM needs compute capability major 10 "
            "(_check_mxfp4_support), sm100 or sm103"
        )
    return blockwise_api_gap() or mxfp4_build_gap()


def auto_cublas_gap(capability: tuple[int, int]) -> str | None:
    """Why ``"auto"`` does not send MX GEMMs of a device PyTorch takes to cuBLAS: they
    are not known to work there.

    Args:
        capability: the CUDA device's ``(major, minor)``.
    Returns:
        The reason, or None on the devices of :data:`AUTO_CUBLAS`.
    """
    if capability in AUTO_CUBLAS:
        return None
    name = sm_name(capability)
    if capability[0] == 12:
        return (
            f"{name}: PyTorch's MX GEMM tests do not cover it and cuBLAS before 13.6 takes "
            "only TN MXFP8 there (pytorch#198126); backend='cublas' forces it"
        )
    return f"{name}: the cuBLAS MX GEMM is not tested on it; backend='cublas' forces it"
