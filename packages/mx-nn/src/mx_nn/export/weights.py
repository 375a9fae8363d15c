"""The MX codes of an MX layer's weight, made by the cast its training forward made, and
back: a high-precision weight whose cast gives stored codes again.

The forward casts ``W`` rowwise (blocks of ``block_size`` along the input features)
with the layer's ``weight_fmt``, ``scale_mode`` and cast backend, after casting it to
the compute dtype (under autocast, the autocast dtype; else the weight's own): so does
:func:`weight_codes`, through the same ``mx_kernels.quantize_rowwise`` with the same
arguments (:func:`mx_nn.casts.compute_path.cast_kwargs`). Its codes equal the rowwise half
of the forward's ``quantize_both`` and, dequantized, the fused path's
``fake_quantize_*`` values.
"""

from __future__ import annotations

import torch

import mx_kernels
from mx_core import E8M0_NAN, MXTensor, get_format
from mx_nn.casts.compute_path import cast_kwargs
from mx_nn.config import MXLinearConfig

__all__ = [
    "COMPUTE_DTYPES",
    "check_compute_dtype",
    "dequantized",
    "storage_of",
    "weight_codes",
    "weight_for",
]

COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Dtypes a training forward may cast a weight in before its MX cast."""


def check_compute_dtype(compute_dtype: object) -> torch.dtype | None:
    """Check an export's ``compute_dtype``.

    Args:
        compute_dtype: the value given.
    Returns:
        ``compute_dtype``: None or one of :data:`COMPUTE_DTYPES`.
    Raises:
        ValueError: any other value.
    """
    if compute_dtype is None or compute_dtype in COMPUTE_DTYPES:
        return compute_dtype  # type: ignore[return-value]
    allowed = ", ".join(["None", *map(str, COMPUTE_DTYPES)])
    raise ValueError(f"compute_dtype={compute_dtype!r}; allowed: {allowed}")


def weight_codes(
    weight: torch.Tensor, config: MXLinearConfig, compute_dtype: torch.dtype | None, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training forward's rowwise MX cast of ``weight`` [N, K].

    Args:
        weight: the layer's weight, any float dtype and device (a plain tensor).
        config: the layer's config (weight format, block size, scale mode, backend).
        compute_dtype: the dtype the forward cast the weight to first (None: its own).
        name: how errors name the layer.

    Returns:
        ``(codes, scale)``: codes [N, K] in the format's storage dtype (fp4: uint8
        [N, K / 2], the even element in the low nibble) and the E8M0 scale bytes, uint8
        [N, K / block_size].

    Raises:
        ValueError: the weight holds NaN or infinity (its blocks would decode to NaN).
    """
    w = weight.detach()
    if compute_dtype is not None and w.dtype != compute_dtype:
        w = w.to(compute_dtype)
    codes, scale = mx_kernels.quantize_rowwise(w, config.weight_fmt.value, **cast_kwargs(config))
    scale = scale.view(torch.uint8)
    bad = int((scale == E8M0_NAN).sum())
    if bad:
        raise ValueError(f"{name!r}: {bad} block(s) hold NaN or infinity, which cannot be served")
    return codes, scale


def dequantized(
    codes: torch.Tensor, scale: torch.Tensor, fmt: str, block_size: int = 32
) -> torch.Tensor:
    """Decode rowwise MX codes.

    Args:
        codes: [..., K] codes (fp4: [..., K / 2] uint8) in ``fmt``.
        scale: [..., K / block_size] E8M0 scale bytes (uint8).
        fmt: the element format's name.
        block_size: elements per scale.
    Returns:
        [..., K] fp32 values ``code * 2 ** (scale - 127)``.
    """
    t = MXTensor(codes, scale.view(torch.float8_e8m0fnu), str(fmt), block_size, codes.dim() - 1,
                 torch.float32)  # fmt: skip
    return t.dequantize()


def _coarser(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    return a if torch.finfo(a).eps >= torch.finfo(b).eps else b


def weight_for(
    codes: torch.Tensor,
    scale: torch.Tensor,
    config: MXLinearConfig,
    dtype: torch.dtype,
    compute_dtype: torch.dtype | None,
    name: str,
    *,
    preserve_codes: bool = True,
) -> torch.Tensor:
    """A ``dtype`` weight whose training cast (:func:`weight_codes`) gives ``codes`` and
    ``scale`` back: the dequantized values, which the cast maps to the same values.

    With FLOOR or EVEN scales the cast of those values gives back the same codes. With
    RCEIL or CEIL a block whose largest code is the lowest one that scale can give
    (e4m3 RCEIL: 224; e2m1 RCEIL: 3) is cast to a scale one lower, every code doubled:
    the same values. With ``preserve_codes`` the largest magnitude of each such block is
    raised by one unit in the last place of the coarser of ``dtype`` and the compute
    dtype, which keeps its code and makes the cast pick the stored scale: the codes and
    scales come back bit for bit; without, the weight is exactly the dequantized values.

    Args:
        codes, scale: the stored codes and uint8 scale bytes (as :func:`weight_codes`
            returns them).
        config: the layer's config.
        dtype: the weight's dtype.
        compute_dtype: as :func:`weight_codes` (None: ``dtype``).
        name: how errors name the layer.
        preserve_codes: raise the blocks' largest magnitudes where needed (above).
    Returns:
        The [N, K] weight in ``dtype``.
    Raises:
        ValueError: the values do not fit ``dtype`` exactly, or (``preserve_codes``)
            some block's cast still differs from the stored one.
    """
    fmt = config.weight_fmt.value
    values = dequantized(codes, scale, fmt, config.block_size)
    weight = values.to(dtype)
    if not torch.equal(weight.to(torch.float32), values):
        raise ValueError(f"{name}: its MX values do not fit {dtype} exactly")
    if not preserve_codes:
        return weight
    cd = compute_dtype or dtype
    blocks = weight.unflatten(-1, (-1, config.block_size))
    again, again_scale = weight_codes(weight, config, cd, name)
    moved = again_scale != scale
    if moved.any():
        step = _coarser(dtype, cd)
        rows, cols = moved.nonzero(as_tuple=True)
        chosen = blocks[rows, cols]
        at = chosen.abs().argmax(dim=-1)
        top = chosen[torch.arange(len(at)), at].to(step)
        away = torch.where(top < 0, float("-inf"), float("inf")).to(step)
        blocks[rows, cols, at] = torch.nextafter(top, away).to(dtype)
        again, again_scale = weight_codes(weight, config, cd, name)
    same = torch.equal(again_scale, scale) and torch.equal(
        again.view(torch.uint8), codes.view(torch.uint8)
    )
    if not same:
        n = int((again_scale != scale).sum())
        raise ValueError(
            f"{name}: no {dtype} weight found whose {fmt} cast ({config.scale_mode_name} "
            f"scales) gives the stored codes back ({n} block scale(s) differ); load with "
            f"preserve_codes=False for the exact dequantized values"
        )
    return weight


def storage_of(fmt: str, shape: tuple[int, int]) -> tuple[torch.dtype, tuple[int, int]]:
    """The storage of the rowwise codes of a weight.

    Args:
        fmt: the element format's name.
        shape: the weight's [N, K].
    Returns:
        ``(dtype, shape)``: the format's storage dtype and [N, K] (fp4: uint8 [N, K // 2]).
    """
    f = get_format(fmt)
    n, k = shape
    return f.storage_dtype, (n, k // 2 if f.is_packed else k)
