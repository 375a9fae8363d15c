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


_Q = mx_core.quantize(torch.randn(4, 64), "fp8_e4m3")
_Q4 = mx_core.quantize(torch.randn(4, 64), "fp4_e2m1")


def _parts(t=_Q, **changes):
    parts = dict(
        qdata=t.qdata, scale=t.scale, fmt=t.fmt, block_size=t.block_size, dim=t.dim,
        orig_dtype=t.orig_dtype,
    )  # fmt: skip
    parts.update(changes)
    return parts


@pytest.mark.parametrize(
    "parts, exc, message",
    [
        (
            _parts(scale=_Q.scale[:, :1]),
            ValueError,
            r"qdata has shape \(4, 64\) but scale \(4, 1\) with block_size=32 along dim 1 "
            r"needs qdata \(4, 32\)",
        ),
        (_parts(block_size=16), ValueError, r"block_size=16 along dim 1 needs qdata \(4, 32\)"),
        (_parts(block_size=True), TypeError, "block_size must be an int, got bool"),
        (_parts(block_size=0), ValueError, "block_size=0 must be >= 1"),
        (_parts(block_size=3), ValueError, "block_size=3 must be a positive multiple of 2"),
        (_parts(dim=0), ValueError, r"scale \(4, 2\) with block_size=32 along dim 0"),
        (_parts(dim=-1), ValueError, "dim=-1 must be non-negative"),
        (_parts(dim=2), ValueError, r"dim=2 is out of range for 2 dims \(allowed: -2 \.\. 1\)"),
        (_parts(dim=True), TypeError, "dim must be an int, got bool"),
        (_parts(scale=_Q.scale[0]), ValueError, "must have the same number of dims"),
        (
            _parts(scale=_Q.scale.view(torch.uint8)),
            TypeError,
            "scale has dtype torch.uint8; expected torch.float8_e8m0fnu",
        ),
        (
            _parts(qdata=_Q.qdata.view(torch.uint8)),
            TypeError,
            "qdata has dtype torch.uint8; fp8_e4m3 codes are stored as torch.float8_e4m3fn",
        ),
        (
            _parts(_Q4, qdata=_Q4.qdata.view(torch.float4_e2m1fn_x2)),
            TypeError,
            r"fp4_e2m1 codes are stored as torch.uint8 \(view packed fp4 as torch.uint8\)",
        ),
        (
            _parts(_Q4, qdata=torch.zeros(4, 64, dtype=torch.uint8)),
            ValueError,
            r"needs qdata \(4, 32\), two fp4 codes per byte",
        ),
        (_parts(fmt="fp8"), ValueError, "fmt='fp8' is not an MX element format"),
        (_parts(fmt=mx_core.get_format("fp8_e4m3")), TypeError, "fmt must be a format name"),
        (_parts(qdata=[1.0]), TypeError, "qdata must be a torch.Tensor, got list"),
        (_parts(orig_dtype=torch.int32), TypeError, "orig_dtype=torch.int32; allowed:"),
        (_parts(orig_dtype="float32"), TypeError, "orig_dtype='float32'; allowed:"),
        (
            _parts(scale=_Q.scale.to("meta")),
            ValueError,
            "qdata is on cpu but scale on meta",
        ),
    ],
)
def test_constructor_refuses_parts_that_do_not_fit(parts, exc, message):
    with pytest.raises(exc, match=message) as e:
        MXTensor(**parts)
    assert str(e.value).startswith("MXTensor: ")


def test_constructor_takes_what_quantize_makes_in_every_layout():
    for fmt in mx_core.FORMAT_NAMES:
        for dim in (0, 1, 2):
            t = mx_core.quantize(torch.randn(64, 32, 64), fmt, dim=dim)
            assert MXTensor(**_parts(t)).shape == (64, 32, 64)
            assert t.transpose(0, 2).narrow(1, 0, 32).shape == (64, 32, 64)


def test_dequantize_refuses_dtypes_that_would_truncate():
    with pytest.raises(ValueError, match=r"dtype=torch.int32 is not supported; allowed: torch"):
        _Q.dequantize(torch.int32)
    with pytest.raises(ValueError, match="dtype=torch.float8_e4m3fn is not supported"):
        mx_core.dequantize(_Q, torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype, got 'float32'"):
        _Q.dequantize("float32")
    assert _Q.dequantize(torch.float64).dtype == torch.float64


def test_bools_are_not_dims_or_indices():
    t = mx_core.quantize(torch.randn(4, 6, 64))
    with pytest.raises(TypeError, match="transpose: dim0 must be an int, got bool"):
        t.transpose(True, 2)
    with pytest.raises(TypeError, match="narrow: dim must be an int, got bool"):
        t.narrow(False, 0, 2)
    with pytest.raises(TypeError, match="narrow: length must be an int"):
        t.narrow(0, 0, 2.0)
    with pytest.raises(TypeError, match="indexing takes ints, slices and ..., got True"):
        t[True]
