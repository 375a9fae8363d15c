"""mx_kernels.fake_quantize_*: Triton (interpreter) bit-exact with
mx_core.quantize(...).dequantize(x.dtype), opcheck and compile."""

from __future__ import annotations

import pytest
import torch

import mx_core
import mx_kernels
from mx_core.testing import assert_same_bits, semantic_inputs
from mx_kernels import cast_launch

FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp4_e2m1"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _data(shape, dtype, seed=0, spread=8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x = x * torch.exp2(torch.randint(-spread, spread + 1, shape[:-1], generator=g)).unsqueeze(-1)
    return x.to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-equal (NaNs only need to be NaN), and contiguous as documented."""
    assert got.is_contiguous()
    assert_same_bits(got, want)


def _want(x, fmt, dim, mode="rceil"):
    return mx_core.quantize(x, fmt, dim=dim, scale_mode=mode).dequantize(x.dtype)


@pytest.mark.parametrize("tile", [(128, 64, 4, 0, 1, False, 0, 8), (64, 32, 2, 0, 1, True, 0, 16)])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1"])
def test_permuted_row_tiles(fmt, tile):
    """Tiles whose rows are held permuted (CastTile.lanes_m) write the same values, in
    x's row order, with ragged M and K masked; NaN and Inf blocks included."""
    x = _data((96, 160), torch.bfloat16, seed=3)
    x[3, 5], x[40, 70] = float("nan"), float("inf")
    f = mx_core.get_format(fmt)
    row, col = torch.empty_like(x), torch.empty_like(x)
    cast_launch.launch_cast(x, f, 32, "rceil", row, None, col, None, tile=tile, dequantized=True)
    _same(row, _want(x, fmt, -1))
    _same(col, _want(x, fmt, 0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_bit_exact(fmt, dtype):
    x = _data((96, 160), dtype)
    _same(mx_kernels.fake_quantize_rowwise(x, fmt, backend="triton"), _want(x, fmt, -1))
    _same(mx_kernels.fake_quantize_colwise(x, fmt, backend="triton"), _want(x, fmt, 0))
    row, col = mx_kernels.fake_quantize_both(x, fmt, backend="triton")
    _same(row, _want(x, fmt, -1))
    _same(col, _want(x, fmt, 0))


@pytest.mark.parametrize("mode", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_semantics_table(fmt, mode):
    x = semantic_inputs(fmt, torch.float32)  # [n_cases, 32], NaN and Inf blocks included
    got = mx_kernels.fake_quantize_rowwise(x, fmt, scale_mode=mode, backend="triton")
    _same(got, _want(x, fmt, -1, mode))
    cols = mx_kernels.fake_quantize_colwise(x.t(), fmt, scale_mode=mode, backend="triton")
    _same(cols, _want(x.t(), fmt, 0, mode))


def test_rank_3_and_strided_inputs():
    x = _data((2, 17, 96), torch.bfloat16)
    _same(mx_kernels.fake_quantize_rowwise(x, backend="triton"), _want(x, "fp8_e4m3", -1))
    base = _data((128, 192), torch.bfloat16, seed=1)
    for view in (base[::2, ::2], base[:64, :96].t()):
        _same(mx_kernels.fake_quantize_rowwise(view, backend="triton"), _want(view, "fp8_e4m3", -1))
        _same(mx_kernels.fake_quantize_colwise(view, backend="triton"), _want(view, "fp8_e4m3", 0))


def test_equals_cast_then_dequantize():
    """The fused pass gives what the two-pass path (cast, then dequantize) gives."""
    x = _data((64, 128), torch.bfloat16, seed=2)
    q, s = mx_kernels.quantize_rowwise(x, backend="triton")
    two_pass = mx_kernels.dequantize_rowwise(q, s, backend="triton")
    assert torch.equal(mx_kernels.fake_quantize_rowwise(x, backend="triton"), two_pass)


def test_bad_input():
    with pytest.raises(ValueError, match="fake_quantize_colwise: x must be 2-D"):
        mx_kernels.fake_quantize_colwise(torch.randn(2, 32, 32))
    with pytest.raises(ValueError, match="backend='gpu'"):
        mx_kernels.fake_quantize_both(torch.randn(32, 32), backend="gpu")


@pytest.mark.parametrize("op", ["fake_quantize_rowwise", "fake_quantize_colwise",
                                "fake_quantize_both"])  # fmt: skip
@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("overload", ["default", "inline"])
def test_opcheck(op, backend, overload):
    x = _data((64, 64), torch.bfloat16)
    fn = getattr(getattr(torch.ops.mx, op), overload)
    torch.library.opcheck(fn, (x, "fp8_e4m3", 32, "rceil", backend))


def test_compiles_without_graph_breaks():
    def f(x):
        row, col = mx_kernels.fake_quantize_both(x, backend="triton")
        return row @ col.t()

    x = _data((64, 96), torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    torch.testing.assert_close(compiled(x), f(x), rtol=0, atol=0)
