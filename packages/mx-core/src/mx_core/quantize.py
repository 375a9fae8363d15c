"""Reference MX quantization along any dim, exact to OCP MX v1.0 (plus the scale modes).

The blocked dim of size K becomes ``[K // block_size, block_size]`` in place
(``unflatten``), so no other dim is ever flattened: a sharded DTensor dim stays sharded.
"""

from __future__ import annotations

import torch

from mx_core import elements
from mx_core.formats import ElementFormat, get_format
from mx_core.packing import _pack_fp4_unchecked
from mx_core.scale import ScaleMode, e8m0_to_float, exponent_to_e8m0, get_scale_mode, scale_exponent
from mx_core.tensor import MXTensor

__all__ = ["quantize", "dequantize", "check_quantize_args", "INPUT_DTYPES"]

INPUT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
"""High-precision dtypes accepted by :func:`quantize`."""


def check_quantize_args(x: torch.Tensor, block_size: int, dim: int, *, fn: str = "quantize") -> int:
    """Validate a quantize call's tensor, block size and dim.

    Args:
        x: the tensor to quantize.
        block_size: elements per scale.
        dim: the blocked dim, negative counting from the end.
        fn: the caller's name in messages.

    Returns:
        ``dim`` made non-negative.

    Raises:
        TypeError: ``x`` is not a tensor of an allowed dtype, or ``block_size`` not an int.
        ValueError: ``block_size`` not a positive multiple of 2, ``dim`` out of range,
            or the dim's size not divisible by ``block_size``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        allowed = ", ".join(str(d) for d in INPUT_DTYPES)
        raise TypeError(f"{fn}: x has dtype {x.dtype}; allowed: {allowed}")
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"{fn}: block_size must be an int, got {type(block_size).__name__}")
    if block_size <= 0 or block_size % 2:
        raise ValueError(f"{fn}: block_size={block_size} must be a positive multiple of 2")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{fn}: dim must be an int, got {type(dim).__name__}")
    if x.dim() == 0:
        raise ValueError(
            f"{fn}: x is 0-d (a scalar, shape ()); MX blocks run along a dim of x, so x "
            f"needs at least 1 dim (dim={dim} was asked for)"
        )
    if not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"{fn}: dim={dim} is out of range for x of shape {tuple(x.shape)} "
            f"(allowed: {-x.dim()} .. {x.dim() - 1})"
        )
    d = dim % x.dim()
    # Under torch.compile the kernels check this at run time instead: branching on a
    # dynamic size here leaves a SymInt among an autograd.Function's outputs, which
    # torch 2.11's dynamo asserts on (overwrite_tensor_vt_proxy).
    if not torch.compiler.is_compiling() and x.shape[d] % block_size:
        raise ValueError(
            f"{fn}: dim {d} of x (shape {tuple(x.shape)}) has size {x.shape[d]}, "
            f"which is not divisible by block_size={block_size}"
        )
    return d


def quantize(
    x: torch.Tensor,
    fmt: str | ElementFormat = "fp8_e4m3",
    *,
    block_size: int = 32,
    dim: int = -1,
    scale_mode: str | ScaleMode = "rceil",
) -> MXTensor:
    """Quantize ``x`` to an MX format in blocks of ``block_size`` along ``dim``.

    Args:
        x: fp32, bf16 or fp16 tensor of any rank >= 1 (and any device).
        fmt: element format name (:data:`mx_core.FORMAT_NAMES`).
        block_size: elements per scale, a positive multiple of 2 dividing ``x.shape[dim]``.
        dim: the blocked dim.
        scale_mode: ``"floor"``, ``"ceil"``, ``"even"`` or ``"rceil"`` (see
            :mod:`mx_core.scale`).
    Returns:
        An :class:`MXTensor`; ``scale`` has x's shape with ``dim`` divided by
        ``block_size``. Blocks holding NaN or +-Inf get scale byte 255 and all their
        elements set to NaN (fp8) or code 0 (fp6/fp4, which have no NaN).
    Raises:
        TypeError, ValueError: bad arguments (the message names the argument).

    Example:
        >>> t = quantize(torch.randn(4, 64), "fp8_e4m3")
        >>> t.qdata.shape, t.scale.shape
        (torch.Size([4, 64]), torch.Size([4, 2]))
    """
    f = get_format(fmt)
    mode = get_scale_mode(scale_mode)
    d = check_quantize_args(x, block_size, dim)
    blocks = x.unflatten(d, (x.shape[d] // block_size, block_size))
    amax = blocks.abs().amax(dim=d + 1)
    exponent = scale_exponent(amax, f, mode)
    nonfinite = ~torch.isfinite(amax)
    scale = exponent_to_e8m0(exponent, nonfinite)
    # 2^-e is exact in fp32 for e in [-127, 127] (2^-127 is subnormal but representable).
    inv_scale = e8m0_to_float(exponent_to_e8m0(-exponent))
    codes = elements.encode(blocks.to(torch.float32) * inv_scale.unsqueeze(d + 1), f)
    codes = _fill_nonfinite_blocks(codes, nonfinite.unsqueeze(d + 1), f)
    codes = codes.flatten(d, d + 1)
    qdata = _pack_fp4_unchecked(codes, d) if f.is_packed else codes  # codes are 0..15: unchecked
    return MXTensor(
        qdata=qdata, scale=scale, fmt=f.name, block_size=block_size, dim=d, orig_dtype=x.dtype
    )


def _fill_nonfinite_blocks(
    codes: torch.Tensor, mask: torch.Tensor, fmt: ElementFormat
) -> torch.Tensor:
    fill = fmt.nan_code if fmt.nan_code is not None else 0
    as_bytes = codes.view(torch.uint8)
    filled = torch.where(mask, torch.full_like(as_bytes, fill), as_bytes)
    return filled.view(codes.dtype)


def dequantize(t: MXTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode an :class:`MXTensor` (same as ``t.dequantize(dtype)``).

    Args:
        t: the MX tensor.
        dtype: the output dtype (None: ``t.orig_dtype``).

    Returns:
        The decoded values, ``t``'s logical shape.

    Raises:
        TypeError: ``t`` not an MXTensor.
    """
    if not isinstance(t, MXTensor):
        raise TypeError(f"dequantize: t must be an MXTensor, got {type(t).__name__}")
    return t.dequantize(dtype)
