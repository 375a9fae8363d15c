"""Which of MXLinear's two paths runs, and the casts' arguments of a config: both asked
on every layer call, so eager code looks them up per config object (a frozen dataclass;
each entry keeps its config, so the id it is keyed by is not reused) instead of
deriving them again (BENCHMARKS.md, 2026-12-04 'Host cost: call plans').

The fused path (fake-quantized casts + bf16 GEMMs) runs where ``scaled_mm`` would
multiply bf16 dequantized operands anyway (its ``dequant_bf16`` design, sm90's choice;
``mx_kernels.bf16_gemm_design``), no fp16 is involved and no MX cast is kept;
``MXLinearConfig.compute_path`` forces either path. Which one runs is logged once per
path and device. On the MX path, where the forward GEMM runs on cuBLAS (sm100), the
casts write their scales in cuBLAS's blocked layout (:func:`blocked_scales`), so no GEMM
swizzles them again.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch

from mx_core import ComputePath
from mx_core.choices import Choice
from mx_kernels.matmul import bf16_gemm_design, scaled_mm_backend
from mx_nn.config import MXLinearConfig

__all__ = [
    "blocked_scales", "cast_kwargs", "check_gemm_backends", "clear_decisions", "fake_quant_path",
]  # fmt: skip

logger = logging.getLogger("mx_nn")
GEMM_BLOCK = 32  # the only block size of the MX GEMMs
_LOGGED: set[tuple[str, str, str]] = set()


def cast_kwargs(c: MXLinearConfig) -> dict:
    """The casts' keyword arguments of config ``c``; made once per config object in
    eager code (callers only unpack it), since a layer call asks for them several times.

    Args:
        c: the layer's config.

    Returns:
        ``{"block_size": int, "scale_mode": str, "backend": str}`` (shared: not to be
        changed).
    """
    if torch.compiler.is_compiling():
        return _cast_kwargs_of(c)
    hit = _KWARGS.get(id(c))
    if hit is None or hit[0] is not c:  # the config kept in the entry: ids can be reused
        if len(_KWARGS) >= 4096:
            _KWARGS.clear()
        hit = _KWARGS[id(c)] = (c, _cast_kwargs_of(c))
    return hit[1]


def _cast_kwargs_of(c: MXLinearConfig) -> dict:
    # Plain values, as ``CastSettings.as_kwargs()`` gives them (the three casts share
    # all but fmt); no CastSettings is built, since torch.compile traces this.
    return {"block_size": c.block_size, "scale_mode": c.scale_mode_name,
            "backend": c.cast_backend.value}  # fmt: skip


_KWARGS: dict[int, tuple[MXLinearConfig, dict]] = {}


def fake_quant_path(device: torch.device, c: MXLinearConfig, dtype: torch.dtype) -> bool:
    """Whether MXLinear runs its fused path on ``device`` for ``dtype`` inputs: every
    GEMM would be scaled_mm's dequant_bf16 design, fp16 is not involved (fake-quantized
    fp16 values can leave fp16's range where the MX path's bf16 ones do not), and no MX
    cast is kept. Decided once per config object, device and dtype: set
    ``MX_KERNELS_MM_DESIGN`` before the first step (:func:`clear_decisions` forgets).

    A constant to torch.compile. Its arguments reach it as plain values: torch 2.11's
    dynamo cannot rebuild a frozen dataclass to call such a function ("can't reconstruct
    arbitrary frozen dataclass instances").

    Args:
        device: the input's device.
        c: the layer's config.
        dtype: the dtype the GEMMs' inputs have (under autocast, the autocast dtype).

    Returns:
        True for the fused path, False for the MX path.
    """
    return _decision(device, c, dtype)[0]


def blocked_scales(device: torch.device, c: MXLinearConfig, dtype: torch.dtype) -> bool:
    """Whether MXLinear's MX path asks its casts for scales in cuBLAS's blocked layout:
    where its forward GEMM would run on cuBLAS (``mx_kernels.scaled_mm_backend``; sm100
    and sm103), blocks of 32, the MX path. A GEMM of the layer on another backend
    unswizzles them (correct; a copy). Decided with :func:`fake_quant_path`, once per
    config object, device and dtype; a constant to torch.compile.

    Args:
        device: the input's device.
        c: the layer's config.
        dtype: the dtype the GEMMs' inputs have (the forward GEMM's result dtype).

    Returns:
        True where the casts write blocked scales.
    """
    return _decision(device, c, dtype)[1]


def _decision(device: torch.device, c: MXLinearConfig, dtype: torch.dtype) -> tuple[bool, bool]:
    """(fused path, blocked scales) of ``c`` on ``device`` for ``dtype``."""
    if torch.compiler.is_compiling():
        return _decision_of(device.type, device.index, _fields(c), dtype)
    # Eager: asked on every call, and resolving three GEMM backends costs tens of us of
    # host time; the answer depends on the config (keyed by the object: it is frozen, and
    # the entry keeps it, so its id is not reused), the device and the dtype, and on the
    # GEMM design's variable as it was when they were first seen: reading the variable
    # on every call cost a few us of a layer call's host time (a compiled model, too,
    # fixes the decision when it is traced).
    key = (id(c), device, dtype)
    hit = _PATHS.get(key)
    if hit is None or hit[0] is not c:
        if len(_PATHS) >= 4096:
            _PATHS.clear()
        hit = _PATHS[key] = (c, *_decide(device.type, device.index, _fields(c), dtype))
    if hit[3] not in _LOGGED:
        _log_path(hit[3])
    return hit[1], hit[2]


def check_gemm_backends(c: MXLinearConfig, device: torch.device, where: str) -> None:
    """Refuse, before any layer runs, a config whose GEMMs cannot run on ``device``:
    ``gemm_backend="cublas"`` where PyTorch's cuBLAS MX GEMM cannot (the capability, the
    MXFP4 API ``torch.nn.functional.scaled_mm`` or the build feature missing) or for a
    combination it does not take; ``"triton"`` without Triton on the device. Meta
    tensors are not checked (a model built on meta is moved before it runs); ``"auto"``
    always has a backend (the emulated one off CUDA, where it logs that choice).

    Args:
        c: the config.
        device: where the layers' weights are.
        where: the caller, for the message (``"mx_nn.convert"``).

    Raises:
        ValueError: a GEMM of ``c`` has no backend on ``device``; the message names the
            GEMM, the formats and what is missing, and how to choose another backend.
    """
    if device.type == "meta" or c.block_size != GEMM_BLOCK:
        return  # blocks other than 32 and fp6 multiply in fp32, on no MX backend
    backend = c.gemm_backend.value if isinstance(c.gemm_backend, Choice) else c.gemm_backend
    for name, (a, b) in _gemm_formats(c).items():
        try:
            scaled_mm_backend(device, a, b, backend=backend)
        except (RuntimeError, ValueError) as e:
            raise ValueError(
                f"{where}: gemm_backend={backend!r} cannot run the {name} GEMM "
                f"({a} x {b}) on {device}: {e}. Choose gemm_backend='auto' (cuBLAS where "
                "it runs, else Triton) or 'emulated' (fp32 reference, slow)"
            ) from None


def _gemm_formats(c) -> dict[str, tuple[str, str]]:
    """The (a, b) formats of each MX GEMM of a layer of config ``c`` (or of its fields)."""
    gemms = {"Y": (c.input_fmt, c.weight_fmt), "dX": (c.grad_output_fmt, c.weight_fmt)}
    if not c.hp_weight_grad:
        gemms["dW"] = (c.grad_output_fmt, c.input_fmt)
    return gemms


def clear_decisions() -> None:
    """Forget every path decided (the next call of each config decides again)."""
    _PATHS.clear()


_CONFIG_FIELDS = ("input_fmt", "weight_fmt", "grad_output_fmt", "block_size", "gemm_backend",
                  "hp_weight_grad", "compute_path")  # fmt: skip
_PATHS: dict[tuple, tuple[MXLinearConfig, bool, bool, tuple[str, str, str]]] = {}


def _fields(c: MXLinearConfig) -> tuple:
    # The choices (enum members) as plain strings: what the decision and its log see.
    values = (getattr(c, f) for f in _CONFIG_FIELDS)
    return tuple(v.value if isinstance(v, Choice) else v for v in values)


@torch.compiler.assume_constant_result
def _decision_of(
    device_type: str, device_index: int | None, fields: tuple, dtype: torch.dtype
) -> tuple[bool, bool]:
    fused, blocked, log_key = _decide(device_type, device_index, fields, dtype)
    _log_path(log_key)
    return fused, blocked


def _decide(
    device_type: str, device_index: int | None, fields: tuple, dtype: torch.dtype
) -> tuple[bool, bool, tuple[str, str, str]]:
    """(whether to run the fused path, whether the MX path's casts write blocked
    scales, what to log of it)."""
    c = SimpleNamespace(**dict(zip(_CONFIG_FIELDS, fields, strict=True)))
    device = torch.device(device_type, device_index)
    if c.compute_path != ComputePath.AUTO:
        fused = c.compute_path == ComputePath.FAKE_QUANT
        why = f" (compute_path={c.compute_path!r})"
    elif c.block_size != GEMM_BLOCK or dtype == torch.float16:
        fused, why = False, ""
    else:
        pairs = _gemm_formats(c).values()
        # dX and the forward GEMM return the input's dtype, dW the weight's (the same
        # outside autocast; under it, both the autocast dtype)
        fused = all(
            bf16_gemm_design(device, a, b, backend=c.gemm_backend, out_dtype=dtype)
            for a, b in pairs
        )
        why = ""
    blocked = (
        not fused
        and c.block_size == GEMM_BLOCK
        and scaled_mm_backend(
            device, c.input_fmt, c.weight_fmt, backend=c.gemm_backend, out_dtype=dtype
        )
        == "cublas"
    )
    path = "fake-quantized casts + bf16 GEMMs" if fused else "MX casts + scaled_mm"
    if blocked:
        path += " (scales written in cuBLAS's blocked layout)"
    return fused, blocked, (path, str(device), why)


def _log_path(key: tuple[str, str, str]) -> None:
    if key not in _LOGGED:  # once per path and device
        _LOGGED.add(key)
        logger.info("mx_nn.MXLinear: %s on %s%s", *key)
