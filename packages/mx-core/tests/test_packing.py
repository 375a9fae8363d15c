import pytest
import torch

import mx_core


def test_fp4_hand_example_low_nibble_first():
    codes = torch.tensor([[0x1, 0xA, 0xF, 0x0]], dtype=torch.uint8)
    packed = mx_core.pack_fp4(codes)
    assert packed.tolist() == [[0xA1, 0x0F]]
    assert torch.equal(mx_core.unpack_fp4(packed), codes)
    assert mx_core.as_float4_x2(packed).dtype == torch.float4_e2m1fn_x2


def test_fp6_hand_example_little_endian():
    codes = torch.tensor([0x01, 0x02, 0x03, 0x3F], dtype=torch.uint8)
    # w = 1 | 2<<6 | 3<<12 | 63<<18 = 0xFC3081
    assert mx_core.pack_fp6(codes).tolist() == [0x81, 0x30, 0xFC]


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_round_trips_along_any_dim(dim):
    g = torch.Generator().manual_seed(1)
    codes4 = torch.randint(0, 16, (4, 8, 12), generator=g, dtype=torch.uint8)
    codes6 = torch.randint(0, 64, (4, 8, 12), generator=g, dtype=torch.uint8)
    p4 = mx_core.pack_fp4(codes4, dim)
    assert p4.shape[dim] == codes4.shape[dim] // 2
    assert torch.equal(mx_core.unpack_fp4(p4, dim), codes4)
    p6 = mx_core.pack_fp6(codes6, dim)
    assert p6.shape[dim] == codes6.shape[dim] * 3 // 4
    assert torch.equal(mx_core.unpack_fp6(p6, dim), codes6)


def test_bad_packing_input():
    with pytest.raises(ValueError, match="size 3 of dim 0 is not a multiple of 2"):
        mx_core.pack_fp4(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not a multiple of 4"):
        mx_core.pack_fp6(torch.zeros(6, dtype=torch.uint8))
    with pytest.raises(TypeError, match="must be uint8"):
        mx_core.pack_fp4(torch.zeros(4))
