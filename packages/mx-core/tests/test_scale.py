import numpy as np
import pytest
import torch

import mx_core
from mx_core import ScaleMode


def test_scale_modes_by_name_and_enum():
    assert [m.value for m in ScaleMode] == ["floor", "ceil", "even", "rceil"]
    assert mx_core.get_scale_mode("rceil") is ScaleMode.RCEIL
    assert mx_core.get_scale_mode(ScaleMode.EVEN) is ScaleMode.EVEN
    with pytest.raises(ValueError, match=r"scale_mode='round'.*allowed: floor, ceil, even, rceil"):
        mx_core.get_scale_mode("round")


def test_e8m0_range_ends_and_nan():
    b = torch.tensor([0, 1, 127, 254, 255], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    v = mx_core.e8m0_to_float(b)
    assert v[:4].tolist() == [2.0**-127, 2.0**-126, 1.0, 2.0**127]
    assert v[4].isnan()
    # Agrees with torch's own decoding of the dtype.
    torch.testing.assert_close(v, b.float(), equal_nan=True, rtol=0, atol=0)
    assert mx_core.e8m0_to_exponent(b).tolist() == [-127, -126, 0, 127, 128]


def test_exponent_to_e8m0_round_trip_and_nan_mask():
    e = torch.arange(-127, 128, dtype=torch.int32)
    s = mx_core.exponent_to_e8m0(e)
    assert s.dtype == torch.float8_e8m0fnu
    assert torch.equal(mx_core.e8m0_to_exponent(s), e)
    masked = mx_core.exponent_to_e8m0(e, e > 100)
    assert (masked.view(torch.uint8)[e > 100] == 255).all()


def _oracle_exponent(amax: np.ndarray, fmt: str, mode: str) -> np.ndarray:
    f = mx_core.get_format(fmt)
    a = amax.astype(np.float64)
    if mode == "floor":
        e = np.floor(np.log2(a)) - f.emax
    elif mode == "ceil":
        e = np.ceil(np.log2(a)) - f.emax
    elif mode == "rceil":
        e = np.ceil(np.log2(a / f.max_normal))
    else:
        m, ex = np.frexp(a)
        steps = 2.0 ** (f.mbits + 1)
        e = ex - 1 + (np.round(m * steps) == steps) - f.emax
    # fp32's top: where amax rounded to mbits bits reaches 2^128, the floor exponent.
    m, ex = np.frexp(a)
    steps = 2.0 ** (f.mbits + 1)
    e = np.where(ex - 1 + (np.round(m * steps) == steps) > 127, 127 - f.emax, e)
    return np.clip(e, -127, 127).astype(np.int32)


@pytest.mark.parametrize("mode", [m.value for m in ScaleMode])
@pytest.mark.parametrize("fmt", mx_core.FORMAT_NAMES)
def test_scale_exponent_matches_float64_math_over_the_fp32_range(fmt, mode):
    g = torch.Generator().manual_seed(0)
    # Random fp32 bit patterns of positive finite numbers, subnormals included.
    bits = torch.randint(1, 0x7F800000, (20000,), generator=g, dtype=torch.int32)
    amax = bits.view(torch.float32)
    f = mx_core.get_format(fmt)
    # Also every rounding boundary: max_normal times powers of two, and its neighbours.
    edges = torch.tensor([f.max_normal * 2.0**k for k in range(-120, 100)], dtype=torch.float32)
    edges = torch.cat([edges, torch.nextafter(edges, edges * 2), torch.nextafter(edges, edges * 0)])
    amax = torch.cat([amax, edges[torch.isfinite(edges) & (edges > 0)]])
    ours = mx_core.scale_exponent(amax, fmt, mode)
    np.testing.assert_array_equal(ours.numpy(), _oracle_exponent(amax.numpy(), fmt, mode))
