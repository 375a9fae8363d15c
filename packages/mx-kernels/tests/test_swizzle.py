import pytest
import torch

import mx_kernels


def _e8m0(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.uint8).view(torch.float8_e8m0fnu)


def test_hand_checked_tile():
    # One full 128x4 tile whose bytes are their own row-major index mod 256.
    scale = _e8m0(torch.arange(128 * 4).reshape(128, 4) % 256)
    flat = mx_kernels.swizzle_scales(scale).view(torch.uint8).flatten()
    # stored[r1, 4 * r0 + c] = tile[32 * r0 + r1, c]
    assert flat[:8].tolist() == [0, 1, 2, 3, 128, 129, 130, 131]  # rows 0 and 32
    assert flat[16:20].tolist() == [4, 5, 6, 7]  # row 1
    r1, r0, c = 5, 2, 3
    assert flat[r1 * 16 + 4 * r0 + c] == (4 * (32 * r0 + r1) + c) % 256


def test_padding_and_tile_order():
    scale = _e8m0(torch.full((130, 5), 7))
    swizzled = mx_kernels.swizzle_scales(scale)
    assert swizzled.shape == (256, 8) == mx_kernels.swizzled_shape(130, 5)
    assert swizzled.dtype == torch.float8_e8m0fnu and swizzled.is_contiguous()
    flat = swizzled.view(torch.uint8).flatten()
    # Tile (0, 0) is full of 7s; tile (0, 1) holds column 4 and zero padding.
    assert (flat[:512] == 7).all()
    tile01 = flat[512:1024].view(32, 4, 4)
    assert (tile01[:, :, 0] == 7).all() and (tile01[:, :, 1:] == 0).all()


@pytest.mark.parametrize("shape", [(1, 1), (128, 4), (130, 9), (300, 128), (7, 257)])
def test_round_trip(shape):
    g = torch.Generator().manual_seed(0)
    scale = _e8m0(torch.randint(0, 256, shape, generator=g))
    back = mx_kernels.unswizzle_scales(mx_kernels.swizzle_scales(scale), shape)
    assert torch.equal(back.view(torch.uint8), scale.view(torch.uint8))


def test_bad_input():
    with pytest.raises(ValueError, match="must be 2-D"):
        mx_kernels.swizzle_scales(_e8m0(torch.zeros(4)))
    with pytest.raises(TypeError, match="float8_e8m0fnu"):
        mx_kernels.swizzle_scales(torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"needs 512"):
        mx_kernels.unswizzle_scales(_e8m0(torch.zeros(100)), (128, 4))


def test_sizes_must_be_ints_not_bools():
    with pytest.raises(TypeError, match="swizzled_shape: rows must be an int, got bool"):
        mx_kernels.swizzled_shape(True, 4)
    with pytest.raises(ValueError, match="swizzled_shape: cols=-4 must be >= 0"):
        mx_kernels.swizzled_shape(128, -4)
    swizzled = mx_kernels.swizzle_scales(_e8m0(torch.zeros(1, 1)))
    with pytest.raises(TypeError, match=r"unswizzle_scales: shape\[1\] must be an int, got bool"):
        mx_kernels.unswizzle_scales(swizzled, (1, True))
    with pytest.raises(TypeError, match="unswizzle_scales: shape must be \\(rows, cols\\)"):
        mx_kernels.unswizzle_scales(swizzled, 4)
