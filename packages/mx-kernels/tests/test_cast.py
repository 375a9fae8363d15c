import logging

import pytest
import torch

import mx_core
import mx_kernels
from mx_core.testing import semantic_inputs
from mx_kernels import cast_launch

FP8 = ["fp8_e4m3", "fp8_e5m2"]
MODES = ["floor", "ceil", "even", "rceil"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _assert_same(got, want: mx_core.MXTensor):
    qdata, scale = got
    assert qdata.dtype == want.qdata.dtype and scale.dtype == torch.float8_e8m0fnu
    assert qdata.shape == want.qdata.shape and scale.shape == want.scale.shape
    assert torch.equal(_u8(qdata), _u8(want.qdata)), "qdata differs"
    assert torch.equal(_u8(scale), _u8(want.scale)), "scale differs"


def _data(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    # Rows of very different magnitudes, and some exact ties on the fp8 grid.
    x = x * torch.exp2(torch.randint(-10, 10, shape[:-1], generator=g)).unsqueeze(-1)
    x.view(-1)[::7] = torch.randint(-64, 64, x.view(-1)[::7].shape, generator=g) / 4
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("shape", [(1, 32), (33, 64), (2, 17, 96)], ids=str)
def test_rowwise_bit_exact(shape, fmt, mode, dtype):
    x = _data(shape, dtype)
    got = mx_kernels.quantize_rowwise(x, fmt, scale_mode=mode, backend="triton")
    _assert_same(got, mx_core.quantize(x, fmt, scale_mode=mode))


@pytest.mark.parametrize("fmt", FP8)
def test_large_shape_bit_exact(fmt):
    x = _data((128, 4096), torch.bfloat16)
    rows = mx_kernels.quantize_rowwise(x, fmt, backend="triton")
    _assert_same(rows, mx_core.quantize(x, fmt))
    cols = mx_kernels.quantize_colwise(x[:, :256], fmt, backend="triton")
    _assert_same(cols, mx_core.quantize(x[:, :256].t().contiguous(), fmt))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FP8)
def test_semantics_table_rowwise_and_colwise(fmt, mode, dtype):
    x = semantic_inputs(fmt, dtype)  # [n_cases, 32]: one case per row
    ref = mx_core.quantize(x, fmt, scale_mode=mode)
    _assert_same(mx_kernels.quantize_rowwise(x, fmt, scale_mode=mode, backend="triton"), ref)
    # The same blocks as columns: x^T is [32, n_cases]; its colwise cast is x's rowwise.
    cols = mx_kernels.quantize_colwise(x.t(), fmt, scale_mode=mode, backend="triton")
    _assert_same(cols, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FP8)
def test_colwise_and_both_bit_exact(fmt, mode, dtype):
    x = _data((96, 64), dtype, seed=1)
    want_row = mx_core.quantize(x, fmt, scale_mode=mode)
    want_col = mx_core.quantize(x.t().contiguous(), fmt, scale_mode=mode)
    _assert_same(mx_kernels.quantize_colwise(x, fmt, scale_mode=mode, backend="triton"), want_col)
    q_row, s_row, q_col, s_col = mx_kernels.quantize_both(x, fmt, scale_mode=mode, backend="triton")
    _assert_same((q_row, s_row), want_row)
    _assert_same((q_col, s_col), want_col)
    # The GPU's "both" tile packs x^T's codes into words (CastTile.words); a small tile
    # of that kind runs the same code here.
    f = mx_core.get_format(fmt)
    q_row, s_row = cast_launch.empty_cast(x.shape, f, 32, x.device)
    q_col, s_col = cast_launch.empty_cast_t(x.shape, f, 32, x.device)
    words = (32, 32, 1, 0, 1, True, 0, 8, True)
    _, launcher = cast_launch.launch_config("both", f.name, 32, mode, words, False, True)
    assert launcher.constexprs["WORDS_T"]
    cast_launch.launch_cast(x, f, 32, mode, q_row, s_row, q_col, s_col, tile=words)
    _assert_same((q_row, s_row), want_row)
    _assert_same((q_col, s_col.t()), want_col)


@pytest.mark.parametrize(
    "tile",
    [(32, 64, 4), (64, 32, 2), (8, 128, 1), (32, 64, 1, 4, 2), (8, 128, 2, 8, 3)]
    + [(32, 32, 2, 0, 1, True), (8, 64, 1, 0, 1, True)]  # K-first launch order
    + [(128, 64, 4, 0, 1, False, 0, 8), (64, 32, 2, 0, 1, True, 0, 16)]  # rows permuted
    + [(128, 64, 4, 0, 1, False, 0, 8, True), (32, 32, 1, 0, 1, True, 0, 8, True)],  # words
)
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp6_e3m2", "fp4_e2m1"])
def test_tile_variants_bit_exact(fmt, tile):
    """Other tile shapes compute the same bits (the benchmark sweeps them); ragged M and
    K exercise the masks."""
    x = _data((70, 100), torch.bfloat16, seed=4)[:, :96]
    x = x[:64] if fmt == "fp4_e2m1" else x  # packed colwise output needs M % 2 == 0
    want_row = mx_core.quantize(x, fmt)
    want_col = mx_core.quantize(x[:64].t().contiguous(), fmt)
    f = mx_core.get_format(fmt)
    q_row, s_row = cast_launch.empty_cast(x.shape, f, 32, x.device)
    q_col, s_col = cast_launch.empty_cast_t(x[:64].shape, f, 32, x.device)
    cast_launch.launch_cast(x, f, 32, "rceil", q_row, s_row, None, None, tile=tile)
    _assert_same((q_row, s_row), want_row)
    cast_launch.launch_cast(x[:64], f, 32, "rceil", None, None, q_col, s_col, tile=tile)
    _assert_same((q_col, s_col.t()), want_col)
    q_col.zero_()
    cast_launch.launch_cast(x[:64], f, 32, "rceil", q_row[:64], s_row[:64], q_col, s_col, tile=tile)
    _assert_same((q_col, s_col.t()), want_col)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_fp4_of_k_strided_input(dtype, caplog):
    """fp4 from an x strided along K reads a contiguous copy (see _quantize_both_op),
    says so in the log, and returns the same bits."""
    x = _data((96, 64), dtype, seed=7).t()  # [64, 96], strides (1, 64)
    mx_kernels.backend.LOGGED.clear()  # each choice is logged once per process
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        q_row, s_row, q_col, s_col = mx_kernels.quantize_both(x, "fp4_e2m1", backend="triton")
    _assert_same((q_row, s_row), mx_core.quantize(x, "fp4_e2m1"))
    _assert_same((q_col, s_col), mx_core.quantize(x.t().contiguous(), "fp4_e2m1"))
    assert "fp4, x strided along K: copy" in caplog.text


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_colwise_layouts(backend):
    """qdata_t is row-major; scale_t [K, M // 32] is column-major (its transpose is the
    contiguous [M // 32, K] buffer), from every backend and both ops."""
    x = _data((96, 64), torch.bfloat16, seed=5)
    q_t, s_t = mx_kernels.quantize_colwise(x, backend=backend)
    *_, q_t2, s_t2 = mx_kernels.quantize_both(x, backend=backend)
    for q, s in ((q_t, s_t), (q_t2, s_t2)):
        assert q.shape == (64, 96) and q.is_contiguous()
        assert s.shape == (64, 3) and s.stride() == (1, 64) and s.t().is_contiguous()


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_both_rowwise_layouts(backend):
    """quantize_both's s_row [M, K // 32] is column-major (strides (1, M)) from every
    backend, with quantize_rowwise's values; quantize_rowwise's own stays row-major."""
    x = _data((96, 64), torch.bfloat16, seed=6)
    q_row, s_row, *_ = mx_kernels.quantize_both(x, backend=backend)
    assert q_row.shape == (96, 64) and q_row.is_contiguous()
    assert s_row.shape == (96, 2) and s_row.stride() == (1, 96)
    _assert_same((q_row, s_row), mx_core.quantize(x))
    assert mx_kernels.quantize_rowwise(x, backend=backend)[1].is_contiguous()


@pytest.mark.parametrize("block_size", [16, 64])
def test_other_block_sizes(block_size):
    x = _data((64, 128), torch.float32, seed=2)
    _assert_same(
        mx_kernels.quantize_rowwise(x, block_size=block_size, backend="triton"),
        mx_core.quantize(x, block_size=block_size),
    )
    _assert_same(
        mx_kernels.quantize_colwise(x, block_size=block_size, backend="triton"),
        mx_core.quantize(x.t().contiguous(), block_size=block_size),
    )


def test_non_contiguous_inputs():
    base = _data((80, 192), torch.bfloat16, seed=3)
    strided = base[::2, ::2]  # [40, 96], strides (384, 2)
    _assert_same(mx_kernels.quantize_rowwise(strided, backend="triton"), mx_core.quantize(strided))
    transposed = base[:64, :96].t()  # [96, 64], column-major
    _assert_same(
        mx_kernels.quantize_rowwise(transposed, backend="triton"), mx_core.quantize(transposed)
    )
    _assert_same(
        mx_kernels.quantize_colwise(transposed, backend="triton"),
        mx_core.quantize(transposed.t().contiguous()),
    )
    both = mx_kernels.quantize_both(strided[:32, :64], backend="triton")
    _assert_same(both[:2], mx_core.quantize(strided[:32, :64]))
    _assert_same(both[2:], mx_core.quantize(strided[:32, :64].t().contiguous()))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["fp6_e2m3", "fp6_e3m2", "fp4_e2m1"])
def test_fp6_and_fp4_bit_exact(fmt, mode):
    for x in (semantic_inputs(fmt, torch.bfloat16).repeat(32, 1), _data((64, 96), torch.float32)):
        want_row = mx_core.quantize(x, fmt, scale_mode=mode)
        want_col = mx_core.quantize(x.t().contiguous(), fmt, scale_mode=mode)
        _assert_same(
            mx_kernels.quantize_rowwise(x, fmt, scale_mode=mode, backend="triton"), want_row
        )
        _assert_same(
            mx_kernels.quantize_colwise(x, fmt, scale_mode=mode, backend="triton"), want_col
        )
        both = mx_kernels.quantize_both(x, fmt, scale_mode=mode, backend="triton")
        _assert_same(both[:2], want_row)
        _assert_same(both[2:], want_col)


def test_block_sizes_without_triton_run_the_reference_when_auto(
    caplog, monkeypatch, fresh_backend_choices
):
    x = _data((4, 36), torch.float32)
    # auto picks Triton only for CUDA tensors; pretend this one is, to reach the choice.
    monkeypatch.setattr(
        mx_kernels.backend, "_device_choice", lambda op, backend, device_type: ("triton", "auto")
    )
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        _assert_same(
            mx_kernels.quantize_rowwise(x, block_size=6), mx_core.quantize(x, block_size=6)
        )
    assert "reference backend on cpu (block_size=6 has no Triton cast" in caplog.text


def test_auto_on_cpu_is_the_reference_and_says_so(caplog):
    x = _data((4, 64), torch.float32)
    mx_kernels.backend.LOGGED.clear()
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        _assert_same(mx_kernels.quantize_rowwise(x), mx_core.quantize(x))
        mx_kernels.quantize_rowwise(x)
    lines = [r.getMessage() for r in caplog.records if "quantize_rowwise" in r.getMessage()]
    assert lines == [
        "mx_kernels.quantize_rowwise: reference backend on cpu (auto: not a CUDA tensor)"
    ]


def test_triton_on_cpu_without_the_interpreter_is_an_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="needs TRITON_INTERPRET=1"):
        mx_kernels.quantize_rowwise(torch.zeros(2, 32), backend="triton")


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (
            lambda: mx_kernels.quantize_rowwise(torch.zeros(2, 48)),
            ValueError,
            "has size 48, which is not divisible by block_size=32",
        ),
        (
            lambda: mx_kernels.quantize_colwise(torch.zeros(48, 32)),
            ValueError,
            r"dim 0 of x \(shape \(48, 32\)\) has size 48",
        ),
        (lambda: mx_kernels.quantize_colwise(torch.zeros(2, 32, 32)), ValueError, "x must be 2-D"),
        (
            lambda: mx_kernels.quantize_both(torch.zeros(32, 32, dtype=torch.int8)),
            TypeError,
            "x has dtype torch.int8",
        ),
        (
            lambda: mx_kernels.quantize_rowwise(torch.zeros(2, 32), backend="cuda"),
            ValueError,
            "backend='cuda' is not one of auto, triton, reference",
        ),
        (
            lambda: mx_kernels.quantize_rowwise(torch.zeros(2, 32), "fp16"),
            ValueError,
            "fmt='fp16' is not an MX element format",
        ),
        (
            lambda: mx_kernels.quantize_rowwise(torch.zeros(2, 32), scale_mode="x"),
            ValueError,
            "scale_mode='x' is not a scale mode",
        ),
        (
            lambda: mx_kernels.quantize_rowwise(torch.zeros(2, 36), block_size=6, backend="triton"),
            ValueError,
            "block_size=6 has no Triton cast",
        ),
    ],
)
def test_bad_input(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


@pytest.mark.parametrize(
    "fn",
    ["quantize_rowwise", "quantize_colwise", "quantize_both"]
    + ["fake_quantize_rowwise", "fake_quantize_colwise", "fake_quantize_both"],
)
@pytest.mark.parametrize("block_size", [True, 32.0, "32"])
def test_block_size_must_be_an_int_not_a_bool(fn, block_size):
    with pytest.raises(TypeError, match=f"{fn}: block_size must be an int"):
        getattr(mx_kernels, fn)(torch.zeros(32, 32), block_size=block_size)


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("op", ["quantize_rowwise", "quantize_colwise", "quantize_both"])
def test_opcheck(op, backend):
    x = _data((64, 64), torch.bfloat16)
    torch.library.opcheck(getattr(torch.ops.mx, op), (x, "fp8_e4m3", 32, "rceil", backend))


def test_ops_compile_without_graph_breaks():
    def f(x):
        q_row, s_row = mx_kernels.quantize_rowwise(x, backend="triton")
        q_col, s_col = mx_kernels.quantize_colwise(x)
        both = mx_kernels.quantize_both(x, "fp8_e5m2", scale_mode="floor", backend="triton")
        return q_row, s_row, q_col, s_col, *both

    x = _data((64, 96), torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    for got, want in zip(compiled(x), f(x), strict=True):
        assert torch.equal(_u8(got), _u8(want))


def test_compiled_casts_still_check_sizes_at_run_time():
    """Under torch.compile the wrappers skip the divisibility check (mx_core
    check_quantize_args); the op bodies raise the same error when the kernel runs."""

    def f(x):
        return mx_kernels.quantize_rowwise(x, backend="triton")

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    compiled(_data((4, 64), torch.float32))
    with pytest.raises(ValueError, match="has size 48, which is not divisible by block_size=32"):
        compiled(_data((4, 48), torch.float32))
