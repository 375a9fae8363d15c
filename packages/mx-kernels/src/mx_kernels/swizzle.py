"""E8M0 scale swizzle: the "blocked" (32_4_4) layout that cuBLAS block-scaled GEMMs read.

The scale matrix ``[R, C]`` (``R`` rows of the operand, ``C = K // 32``) is padded with
zeros to ``R % 128 == 0`` and ``C % 4 == 0``, cut into 128x4 tiles taken in row-major
tile order, and each tile is stored as 32x16 (512 contiguous bytes)::

    tile[r, c] with r = 32 * r0 + r1 (r0 < 4, r1 < 32), c < 4
      -> stored[r1, 4 * r0 + c]

Spec: cuBLAS docs, "1D Block Scaling Factors Layout"
(https://docs.nvidia.com/cuda/cublas/#d-block-scaling-factors-layout).
"""

from __future__ import annotations

import torch

from mx_core.args import check_int

__all__ = ["swizzle_scales", "unswizzle_scales", "swizzled_shape"]


def _ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def swizzled_shape(rows: int, cols: int) -> tuple[int, int]:
    """Shape of the swizzled (padded) scale matrix.

    Args:
        rows, cols: the scale matrix's shape: the operand's rows and K // 32.
    Returns:
        ``(ceil128(rows), ceil4(cols))``.
    Raises:
        TypeError: rows or cols not an int (a bool included).
        ValueError: rows or cols negative.
    """
    check_int("swizzled_shape", "rows", rows, minimum=0)
    check_int("swizzled_shape", "cols", cols, minimum=0)
    return _ceil_to(rows, 128), _ceil_to(cols, 4)


def _check_scale(scale: torch.Tensor, name: str, *, two_d: bool = True) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"{name} must be float8_e8m0fnu (or its uint8 bytes), got {scale.dtype}")
    if two_d and scale.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, K // 32], got shape {tuple(scale.shape)}")


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """Swizzle a 2-D scale matrix ``[R, C]`` into the blocked layout.

    Args:
        scale: [R, C] ``float8_e8m0fnu`` (or its uint8 bytes), any strides.
    Returns:
        A contiguous tensor of shape :func:`swizzled_shape` (R, C) and the input's dtype,
        whose memory order is the blocked layout (read it flat); padding bytes are zero.
    Raises:
        TypeError: scale not an E8M0 (or uint8) tensor.
        ValueError: scale not 2-D.
    """
    _check_scale(scale, "scale")
    rows, cols = scale.shape
    rp, cp = swizzled_shape(rows, cols)
    padded = scale.view(torch.uint8).new_zeros(rp, cp)
    padded[:rows, :cols] = scale.view(torch.uint8)
    tiles = padded.view(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rp, cp).view(scale.dtype)


def unswizzle_scales(swizzled: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`swizzle_scales`.

    Args:
        swizzled: the blocked layout's bytes, ``float8_e8m0fnu`` or uint8; flat or of any
            shape: only its memory order matters.
        shape: ``(R, C)``, the scale matrix's shape before padding.
    Returns:
        The [R, C] scale matrix, contiguous, in ``swizzled``'s dtype.
    Raises:
        TypeError: swizzled not an E8M0 (or uint8) tensor; shape not two ints.
        ValueError: a negative size, or swizzled's size not that of ``shape`` swizzled.
    """
    _check_scale(swizzled, "swizzled", two_d=False)
    if not isinstance(shape, (tuple, list, torch.Size)) or len(shape) != 2:
        raise TypeError(f"unswizzle_scales: shape must be (rows, cols), got {shape!r}")
    rows, cols = shape
    check_int("unswizzle_scales", "shape[0]", rows, minimum=0)
    check_int("unswizzle_scales", "shape[1]", cols, minimum=0)
    rp, cp = swizzled_shape(rows, cols)
    if swizzled.numel() != rp * cp:
        raise ValueError(
            f"swizzled has {swizzled.numel()} elements; shape {tuple(shape)} needs {rp * cp}"
        )
    tiles = swizzled.reshape(rp // 128, cp // 4, 32, 4, 4).view(torch.uint8)
    padded = tiles.permute(0, 3, 2, 1, 4).reshape(rp, cp)
    return padded[:rows, :cols].contiguous().view(swizzled.dtype)
