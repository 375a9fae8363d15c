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


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (
            lambda: mx_core.pack_fp4(torch.tensor([3, 17], dtype=torch.uint8)),
            ValueError,
            r"pack_fp4: codes holds values up to 17; fp4 codes are 0 \.\. 15",
        ),
        (
            lambda: mx_core.pack_fp6(torch.tensor([0, 1, 64, 2], dtype=torch.uint8)),
            ValueError,
            r"pack_fp6: codes holds values up to 64; fp6 codes are 0 \.\. 63",
        ),
        (
            lambda: mx_core.pack_fp4(torch.zeros(2, 4, dtype=torch.uint8), True),
            TypeError,
            "pack_fp4: dim must be an int, got bool",
        ),
        (
            lambda: mx_core.unpack_fp6(torch.zeros(3, dtype=torch.uint8), 1),
            ValueError,
            r"unpack_fp6: dim=1 is out of range for 1 dims \(allowed: -1 \.\. 0\)",
        ),
        (
            lambda: mx_core.unpack_fp4(torch.tensor(7, dtype=torch.uint8)),
            ValueError,
            "unpack_fp4: dim=-1: a 0-d tensor has no dim",
        ),
    ],
)
def test_codes_out_of_range_and_bad_dims_are_refused(call, exc, message):
    """A code wider than the format would lose its high bits in the packed bytes."""
    with pytest.raises(exc, match=message):
        call()


def test_packing_every_valid_code_is_exact():
    codes4 = torch.arange(16, dtype=torch.uint8).repeat(2)
    assert torch.equal(mx_core.unpack_fp4(mx_core.pack_fp4(codes4)), codes4)
    codes6 = torch.arange(64, dtype=torch.uint8)
    assert torch.equal(mx_core.unpack_fp6(mx_core.pack_fp6(codes6)), codes6)
