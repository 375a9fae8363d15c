import pytest
import torch

import mx_core
from mx_core import MXTensor


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def test_dequantize_at_e8m0_range_ends():
    qdata = torch.ones(2, 32).to(torch.float8_e4m3fn)
    scale = torch.tensor([[0], [254]], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    t = MXTensor(
        qdata=qdata, scale=scale, fmt="fp8_e4m3", block_size=32, dim=1, orig_dtype=torch.float32
    )
    out = t.dequantize()
    assert (out[0] == 2.0**-127).all() and (out[1] == 2.0**127).all()


def test_transpose_tracks_the_blocked_dim():
    x = torch.randn(3, 4, 64)
    t = mx_core.quantize(x, "fp4_e2m1", dim=2)
    tt = t.transpose(0, 2)
    assert tt.dim == 0 and tt.shape == (64, 4, 3)
    torch.testing.assert_close(tt.dequantize(), t.dequantize().transpose(0, 2), rtol=0, atol=0)
    t01 = t.transpose(0, 1)
    assert t01.dim == 2
    torch.testing.assert_close(t01.dequantize(), t.dequantize().transpose(0, 1), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1"])
def test_narrow_and_getitem_are_exact(fmt):
    x = torch.randn(6, 5, 128)
    t = mx_core.quantize(x, fmt)
    full = t.dequantize()
    torch.testing.assert_close(t.narrow(0, 1, 3).dequantize(), full[1:4], rtol=0, atol=0)
    torch.testing.assert_close(t.narrow(2, 32, 64).dequantize(), full[..., 32:96], rtol=0, atol=0)
    torch.testing.assert_close(t[2].dequantize(), full[2], rtol=0, atol=0)
    torch.testing.assert_close(t[1:5:2, ..., :].dequantize(), full[1:5:2], rtol=0, atol=0)
    assert t[2].dim == 1 and t[:, 3].dim == 1


def test_bad_slicing_is_refused():
    t = mx_core.quantize(torch.randn(4, 64))
    with pytest.raises(ValueError, match="multiples of block_size=32"):
        t.narrow(1, 16, 32)
    with pytest.raises(IndexError, match="touches the blocked dim 1"):
        t[:, :32]
    with pytest.raises(ValueError, match="dim1=5 is out of range"):
        t.transpose(0, 5)


def test_to_device_is_bit_exact():
    t = mx_core.quantize(torch.randn(4, 64), "fp6_e3m2")
    u = t.to("cpu")
    assert torch.equal(u.qdata, t.qdata) and torch.equal(_bytes(u.scale), _bytes(t.scale))
    assert "fp6_e3m2" in repr(u)
