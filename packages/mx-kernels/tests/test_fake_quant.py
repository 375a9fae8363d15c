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


def _same_codes(got, want) -> None:
    """Codes or scales bit-equal, with the same shape and strides."""
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_rowwise_values_with_columnwise_codes(fmt, dtype, backend):
    """fake_quantize_rowwise_quantize_colwise is fake_quantize_rowwise and
    quantize_colwise, bit for bit, from one kernel; NaN and Inf blocks included."""
    x = _data((96, 160), dtype)
    x[3, 5], x[40, 70] = float("nan"), float("inf")
    if fmt.startswith("fp6") and backend == "triton":
        backend = "auto"  # fp6 has no Triton cast: auto takes the reference (logged)
    row, q_t, s_t = mx_kernels.fake_quantize_rowwise_quantize_colwise(x, fmt, backend=backend)
    _same(row, _want(x, fmt, -1))
    want_q, want_s = mx_kernels.quantize_colwise(x, fmt, backend="reference")
    _same_codes(q_t, want_q)
    _same_codes(s_t, want_s)


@pytest.mark.parametrize(
    "tile", [(128, 64, 4, 0, 1, True, 96, 8, True), (64, 32, 2, 0, 1, False, 0, 16), None]
)
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1"])
def test_rowwise_values_with_columnwise_codes_tiles(fmt, tile):
    """Every tile of that kind (rows held permuted, word stores of x^T's codes, the GPU
    default) writes the same values and codes, ragged M and K masked."""
    x = _data((96, 160), torch.bfloat16, seed=4)
    x[3, 5] = float("nan")
    f = mx_core.get_format(fmt)
    if tile is None:
        tile = tuple(cast_launch.TILE_CONFIGS["fake_rowwise_codes_colwise"])
    row = torch.empty_like(x)
    q_t, s_buf = cast_launch.empty_cast_t(x.shape, f, 32, "cpu")
    cast_launch.launch_cast(x, f, 32, "rceil", row, None, q_t, s_buf, tile=tile,
                            dequantized="rowwise")  # fmt: skip
    _same(row, _want(x, fmt, -1))
    want_q, want_s = mx_kernels.quantize_colwise(x, fmt, backend="reference")
    _same_codes(q_t, want_q)
    _same_codes(s_buf.t(), want_s)


def test_launch_refuses_an_unknown_dequantized():
    x = torch.zeros(32, 32)
    with pytest.raises(ValueError, match="dequantized='colwise'; allowed False, True, 'rowwise'"):
        cast_launch.launch_cast(x, mx_core.get_format("fp8_e4m3"), 32, "rceil", x, None, None,
                                None, dequantized="colwise")  # fmt: skip


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_opcheck_rowwise_values_with_columnwise_codes(backend):
    x = _data((64, 64), torch.bfloat16)
    fn = torch.ops.mx.fake_quantize_rowwise_quantize_colwise.default
    torch.library.opcheck(fn, (x, "fp8_e4m3", 32, "rceil", backend))


def test_rowwise_values_with_columnwise_codes_compiles():
    def f(x):
        row, q_t, s_t = mx_kernels.fake_quantize_rowwise_quantize_colwise(x, backend="triton")
        col = mx_kernels.dequantize_rowwise(q_t, s_t, out_dtype=x.dtype, backend="triton")
        return row @ col

    x = _data((64, 96), torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    torch.testing.assert_close(compiled(x), f(x), rtol=0, atol=0)
