"""Bit packing of sub-byte element codes along one dim (other dims are never flattened).

- fp4: two 4-bit codes per byte, the first (lower-index) element in the low nibble;
  this is the layout of ``torch.float4_e2m1fn_x2`` and of cuBLAS's packed fp4.
- fp6: four 6-bit codes in three bytes, little-endian: with
  ``w = c0 | c1 << 6 | c2 << 12 | c3 << 18`` the bytes are ``w & 0xFF``,
  ``(w >> 8) & 0xFF``, ``(w >> 16) & 0xFF``.
"""

from __future__ import annotations

import torch

from mx_core.args import check_dim

__all__ = ["pack_fp4", "unpack_fp4", "pack_fp6", "unpack_fp6", "as_float4_x2"]


def _check_codes(codes: torch.Tensor, dim: int, group: int, what: str) -> int:
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"{what}: codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype != torch.uint8:
        raise TypeError(f"{what}: codes must be uint8, got {codes.dtype}")
    d = check_dim(what, "dim", dim, codes.dim())
    if codes.shape[d] % group:
        raise ValueError(f"{what}: size {codes.shape[d]} of dim {d} is not a multiple of {group}")
    return d


def _check_code_values(codes: torch.Tensor, bits: int, what: str) -> None:
    # One reduction over the codes (a device sync on GPUs): a code above 2^bits - 1 would
    # otherwise lose its high bits, and the packed tensor hold another value.
    top = (1 << bits) - 1
    if codes.numel() and bool((codes > top).any()):
        raise ValueError(
            f"{what}: codes holds values up to {int(codes.max())}; fp{bits} codes are "
            f"0 .. {top} ({bits} bits: sign, exponent, mantissa)"
        )


def pack_fp4(codes: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Pack uint8 fp4 codes (values 0..15) two per byte along ``dim`` (size halves).

    Args:
        codes: uint8 codes, one per byte; ``dim`` of even size.
        dim: the dim to pack along.

    Returns:
        uint8, ``codes``' shape with ``dim`` halved (first element in the low nibble).

    Raises:
        TypeError: codes not a uint8 tensor, or dim not an int.
        ValueError: dim out of range, its size odd, or a code above 15.
    """
    d = _check_codes(codes, dim, 2, "pack_fp4")
    _check_code_values(codes, 4, "pack_fp4")
    return _pack_fp4_unchecked(codes, d)


def _pack_fp4_unchecked(codes: torch.Tensor, d: int) -> torch.Tensor:
    """:func:`pack_fp4` of codes known to be valid (uint8, 0..15, dim ``d`` >= 0 of even
    size), unchecked: for callers that made the codes themselves (no device sync)."""
    pairs = codes.unflatten(d, (codes.shape[d] // 2, 2))
    low, high = pairs.select(d + 1, 0), pairs.select(d + 1, 1)
    return torch.bitwise_or(low, torch.bitwise_left_shift(high, 4))


def unpack_fp4(packed: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`.

    Args:
        packed: uint8, two codes a byte along ``dim``.
        dim: the dim they are packed along.

    Returns:
        uint8 codes (0..15), ``packed``'s shape with ``dim`` doubled.

    Raises:
        TypeError: packed not a uint8 tensor, or dim not an int.
        ValueError: dim out of range.
    """
    d = _check_codes(packed, dim, 1, "unpack_fp4")
    low = torch.bitwise_and(packed, 0xF)
    high = torch.bitwise_right_shift(packed, 4)
    return torch.stack([low, high], dim=d + 1).flatten(d, d + 1)


def pack_fp6(codes: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Pack uint8 fp6 codes (values 0..63) four in three bytes along ``dim``.

    Args:
        codes: uint8 codes, one per byte; ``dim`` a multiple of 4.
        dim: the dim to pack along.

    Returns:
        uint8, ``codes``' shape with ``dim`` times 3/4 (little-endian, module doc).

    Raises:
        TypeError: codes not a uint8 tensor, or dim not an int.
        ValueError: dim out of range, its size not a multiple of 4, or a code above 63.
    """
    d = _check_codes(codes, dim, 4, "pack_fp6")
    _check_code_values(codes, 6, "pack_fp6")
    c = codes.unflatten(d, (codes.shape[d] // 4, 4)).to(torch.int32)
    w = c.select(d + 1, 0)
    for i in (1, 2, 3):
        w = torch.bitwise_or(w, torch.bitwise_left_shift(c.select(d + 1, i), 6 * i))
    parts = [torch.bitwise_and(torch.bitwise_right_shift(w, 8 * i), 0xFF) for i in range(3)]
    return torch.stack(parts, dim=d + 1).flatten(d, d + 1).to(torch.uint8)


def unpack_fp6(packed: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Inverse of :func:`pack_fp6`.

    Args:
        packed: uint8, four codes in three bytes along ``dim``.
        dim: the dim they are packed along.

    Returns:
        uint8 codes (0..63), ``packed``'s shape with ``dim`` times 4/3.

    Raises:
        TypeError: packed not a uint8 tensor, or dim not an int.
        ValueError: dim out of range, or its size not a multiple of 3.
    """
    d = _check_codes(packed, dim, 3, "unpack_fp6")
    b = packed.unflatten(d, (packed.shape[d] // 3, 3)).to(torch.int32)
    w = b.select(d + 1, 0)
    for i in (1, 2):
        w = torch.bitwise_or(w, torch.bitwise_left_shift(b.select(d + 1, i), 8 * i))
    codes = [torch.bitwise_and(torch.bitwise_right_shift(w, 6 * i), 0x3F) for i in range(4)]
    return torch.stack(codes, dim=d + 1).flatten(d, d + 1).to(torch.uint8)


def as_float4_x2(packed: torch.Tensor) -> torch.Tensor:
    """View packed fp4 bytes as ``torch.float4_e2m1fn_x2`` (same bytes, no copy).

    Args:
        packed: uint8 bytes of :func:`pack_fp4`, any shape.

    Returns:
        The same storage as ``torch.float4_e2m1fn_x2``, ``packed``'s shape.

    Raises:
        TypeError: packed not uint8.
    """
    if packed.dtype != torch.uint8:
        raise TypeError(f"as_float4_x2: packed must be uint8, got {packed.dtype}")
    return packed.view(torch.float4_e2m1fn_x2)
