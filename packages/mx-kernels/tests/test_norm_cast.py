"""RMSNorm + MX cast (mx_kernels.norm_cast): the Triton kernel under the interpreter
against the plain-torch reference and the casts.

Exactness, as the module states it: the codes and scales equal ``quantize_rowwise`` /
``quantize_both`` of the kernel's own y bit for bit; y equals the reference given the
kernel's rstd bit for bit; rstd and y equal the reference bit for bit where the sum of
squares is exact in any order (small integers); otherwise rstd is within 2 ulp of fp32
and y within 1 ulp of x's dtype (fp32: 4 ulp). The backward is within
``BACKWARD_TOL`` of float64 autograd. Shapes stay small: the interpreter runs the
cast's amax reduction element by element (about 0.1 ms per element).
"""

import logging

import pytest
import torch

import mx_core
import mx_kernels
from mx_kernels.cast_launch import empty_cast
from mx_kernels.norm_cast import rms_norm_backward, rms_norm_quantize, rms_norm_reference
from mx_kernels.norm_cast_triton import rms_norm_backward_triton, rms_norm_cast_triton

FORMATS = list(mx_core.FORMAT_NAMES)
MODES = ["floor", "ceil", "even", "rceil"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Pairwise: every format with every mode (bf16), every format with every dtype (rceil),
# every mode with every dtype (fp8_e4m3); the cast itself is mx_kernels.cast's, tested
# over the whole product in test_cast.py.
COMBOS = sorted(
    {(f, m, torch.bfloat16) for f in FORMATS for m in MODES}
    | {(f, "rceil", d) for f in FORMATS for d in DTYPES}
    | {("fp8_e4m3", m, d) for m in MODES for d in DTYPES},
    key=str,
)
EPS = 1e-6
# (rtol, atol as a fraction of the reference's largest magnitude) per dtype of x: fp32
# sums in another order; bf16/fp16 outputs are rounded once from fp32 (the reference's
# autograd in x's dtype rounds dy * weight and dy * n too).
BACKWARD_TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (2**-7, 2**-8),
    torch.float16: (2**-10, 2**-11),
}


def _u8(t):
    return t.detach().contiguous().view(torch.uint8)


def _same_bits(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(_u8(g), _u8(w))


def _data(shape, dtype, seed=0, spread=8):
    """Normal values, each row scaled by 2^e, e uniform in [-spread, spread)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    e = (
        torch.randint(-spread, spread, shape[:-1], generator=gen)
        if spread
        else torch.zeros(shape[:-1])
    )
    x = x * torch.exp2(e).unsqueeze(-1)
    return x.to(dtype)


def _weight(k, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (1 + 0.5 * torch.randn(k, generator=gen)).to(dtype)


def _given_rstd(x, weight, rstd):
    """The reference's y from a given rstd: every step but the sum of squares."""
    return (weight * (x.float() * rstd.unsqueeze(-1)).to(x.dtype)).to(x.dtype)


def _ulps(a, b):
    """Largest distance in units in the last place between same-signed float tensors."""
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return (a.view(ints).long() - b.view(ints).long()).abs().max().item()


def _check_forward(x, weight, fmt, mode, colwise):
    outs = rms_norm_quantize(
        x, weight, EPS, fmt, scale_mode=mode, backend="triton", colwise=colwise
    )
    y, rstd = outs[:2]
    assert y.dtype == x.dtype and y.is_contiguous() and rstd.dtype == torch.float32
    assert torch.equal(y, _given_rstd(x, weight, rstd))
    y_ref, rstd_ref = rms_norm_reference(x, weight, EPS)
    assert _ulps(rstd, rstd_ref) <= 2
    assert _ulps(y, y_ref) <= (4 if x.dtype == torch.float32 else 1)
    if colwise:
        y2d = y.reshape(-1, x.shape[-1])
        want = mx_kernels.quantize_both(y2d, fmt, scale_mode=mode, backend="reference")
        _same_bits(outs[2:], want)
        for got, w in zip(outs[2:], want, strict=True):  # the layouts too
            assert got.t().is_contiguous() == w.t().is_contiguous()
    else:
        q = mx_core.quantize(y, fmt, scale_mode=mode)
        _same_bits(outs[2:], (q.qdata, q.scale))
    return outs


@pytest.mark.parametrize("fmt, mode, dtype", COMBOS, ids=str)
def test_formats_modes_and_dtypes(fmt, mode, dtype):
    """Rowwise for each combination; both casts for each in bf16 (the other dtypes in
    test_shapes)."""
    x, w = _data((5, 64), dtype), _weight(64, dtype)  # 5 rows: not a multiple of the tile
    _check_forward(x, w, fmt, mode, colwise=False)
    if dtype == torch.bfloat16:
        _check_forward(_data((32, 64), dtype, seed=2), w, fmt, mode, colwise=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_exact_sums_give_the_reference_bit_for_bit(dtype):
    """Small integers times a power of two per row: every partial sum of squares is exact,
    so rstd and y are the reference's whatever the order of the additions."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-8, 9, (7, 2048), generator=gen)
    x = x * torch.exp2(torch.randint(-6, 6, (7, 1), generator=gen))
    x, w = x.to(dtype), _weight(2048, dtype)
    y, rstd, *_ = _check_forward(x, w, "fp8_e4m3", "rceil", colwise=False)
    y_ref, rstd_ref = rms_norm_reference(x, w, EPS)
    assert torch.equal(rstd, rstd_ref) and torch.equal(y, y_ref)


@pytest.mark.parametrize(
    "shape, colwise, dtype",
    [
        ((3, 4096), False, torch.bfloat16),
        ((2, 3, 160), False, torch.bfloat16),
        ((2, 16, 96), True, torch.float16),
        ((64, 32), True, torch.float32),
        ((1, 32), False, torch.float16),
    ],
    ids=str,
)
def test_shapes(shape, colwise, dtype):
    """K up to 4096 in one pass, K not a power of two, folded leading dims (the columnwise
    cast of the [M, K] fold), several column tiles, one row."""
    x, w = _data(shape, dtype), _weight(shape[-1], dtype)
    outs = _check_forward(x, w, "fp8_e4m3", "rceil", colwise)
    assert outs[0].shape == shape and outs[1].shape == shape[:-1]


@pytest.mark.parametrize("fmt", ["fp8_e5m2", "fp4_e2m1"])
def test_rows_in_chunks(fmt):
    """K longer than the tile: the kernel reads the row twice (sum of squares, then y)."""
    x, w = _data((6, 256), torch.bfloat16), _weight(256, torch.bfloat16)
    f = mx_core.get_format(fmt)
    y, rstd = torch.empty_like(x), torch.empty(6)
    q, s = empty_cast(x.shape, f, 32, "cpu")
    rms_norm_cast_triton(x, w, EPS, f, 32, "rceil", y, rstd, q, s, tile=(4, 64, 4))
    assert torch.equal(y, _given_rstd(x, w, rstd))
    want = mx_core.quantize(y, fmt)
    _same_bits((q, s), (want.qdata, want.scale))


def test_strided_input_and_fp32_weight():
    x = _data((64, 48), torch.bfloat16).t()  # [48, 64], strided along K
    w = _weight(64, torch.float32)  # y stays in x's dtype
    _check_forward(x, w, "fp6_e2m3", "even", colwise=False)


def test_reference_backend_is_torch_and_the_cast():
    x, w = _data((4, 64), torch.float16), _weight(64, torch.float16)
    y, rstd, q, s = rms_norm_quantize(x, w, EPS, "fp4_e2m1", backend="reference")
    y_ref, rstd_ref = rms_norm_reference(x, w, EPS)
    assert torch.equal(y, y_ref) and torch.equal(rstd, rstd_ref)
    want = mx_core.quantize(y_ref, "fp4_e2m1")
    _same_bits((q, s), (want.qdata, want.scale))


def test_auto_on_cpu_is_the_reference_and_says_so(caplog):
    x, w = _data((4, 64), torch.float32), _weight(64, torch.float32)
    mx_kernels.backend.LOGGED.clear()
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        rms_norm_quantize(x, w, EPS)
        rms_norm_quantize(x, w, EPS)
    lines = [r.getMessage() for r in caplog.records if "rms_norm_quantize" in r.getMessage()]
    assert lines == [
        "mx_kernels.rms_norm_quantize: reference backend on cpu (auto: not a CUDA tensor)"
    ]


def _f64_grads(x, w, dy):
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w64
    return torch.autograd.grad(y, (x64, w64), dy.double())


def _close(got, want, dtype):
    rtol, atol = BACKWARD_TOL[dtype]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol * want.abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, tile", [((37, 256), None), ((2, 5, 96), (2, 32, 4))], ids=str)
def test_backward_within_tolerance(shape, tile, dtype):
    """Triton (in one pass, and with tile (2, 32, 4) in chunks of K) and the reference
    backend against float64 autograd; through autograd too."""
    x, w = _data(shape, dtype, spread=3), _weight(shape[-1], dtype)
    dy = _data(shape, dtype, seed=5, spread=0)  # fp16's dx stays finite
    dx64, dw64 = _f64_grads(x, w, dy)
    rstd = rms_norm_reference(x, w, EPS)[1]
    k = shape[-1]
    dx, dw = rms_norm_backward_triton(
        dy.reshape(-1, k), x.reshape(-1, k), w, rstd.reshape(-1), tile
    )
    _close(dx.view(shape), dx64, dtype)
    _close(dw, dw64, dtype)
    for backend in ("reference", "triton"):
        dx, dw = rms_norm_backward(dy, x, w, rstd, backend=backend)
        assert dx.dtype == x.dtype and dw.dtype == w.dtype
        _close(dx, dx64, dtype)
        _close(dw, dw64, dtype)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y, rstd, *_ = rms_norm_quantize(xg, wg, EPS, backend="triton")
    y.backward(dy)
    want = rms_norm_backward(dy, x, w, rstd, backend="triton")  # the same kernel, same rstd
    assert torch.equal(xg.grad, want[0]) and torch.equal(wg.grad, want[1])
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()  # the reference's autograd
    rms_norm_reference(xr, wr, EPS)[0].backward(dy)
    _close(xg.grad, xr.grad.double(), dtype)
    _close(wg.grad, wr.grad.double(), dtype)


def _bad(**kw):
    args = dict(x=torch.zeros(2, 32), weight=torch.ones(32), eps=EPS) | kw
    return lambda: rms_norm_quantize(args.pop("x"), args.pop("weight"), args.pop("eps"), **args)


_BACKWARD = (torch.zeros(2, 32), torch.ones(32), torch.ones(2))  # x, weight, rstd


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (_bad(x=torch.zeros(2, 48)), ValueError, "has size 48, which is not divisible by"),
        (_bad(x=torch.zeros(2, 32, dtype=torch.int32)), TypeError, "x has dtype torch.int32"),
        (_bad(weight=torch.ones(64)), ValueError, r"weight has shape \(64,\); .* needs \(32,\)"),
        (_bad(weight=torch.ones(32).double()), TypeError, "weight has dtype torch.float64"),
        (_bad(weight=[1.0] * 32), TypeError, "weight must be a torch.Tensor, got list"),
        (_bad(eps=-1.0), ValueError, "eps=-1.0 must be finite and >= 0"),
        (_bad(eps="1e-6"), TypeError, "eps must be a float, got str"),
        (_bad(fmt="fp16"), ValueError, "fmt='fp16' is not an MX element format"),
        (_bad(scale_mode="x"), ValueError, "scale_mode='x' is not a scale mode"),
        (_bad(backend="cuda"), ValueError, "backend='cuda' is not one of auto, triton, reference"),
        (_bad(colwise=1), TypeError, "colwise must be a bool, got 1"),
        (_bad(colwise=True), ValueError, "colwise=True .* M=2, which is not divisible by"),
        (
            _bad(x=torch.zeros(2, 36), weight=torch.ones(36), block_size=6, backend="triton"),
            ValueError,
            "block_size=6 has no Triton kernel",
        ),
        (
            lambda: rms_norm_backward(torch.zeros(2, 64), *_BACKWARD),
            ValueError,
            r"dy has shape \(2, 64\)",
        ),
        (
            lambda: rms_norm_backward(torch.zeros(2, 32), *_BACKWARD[:2], torch.ones(2).double()),
            ValueError,
            "rstd has dtype torch.float64",
        ),
    ],
)
def test_bad_input(call, exc, message):
    with pytest.raises(exc, match=f"rms_norm_(quantize|backward): .*{message}"):
        call()


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_opcheck(backend):
    x, w = _data((32, 32), torch.bfloat16), _weight(32, torch.bfloat16)
    args = (x, w, EPS, "fp8_e4m3", 32, "rceil", backend)
    torch.library.opcheck(torch.ops.mx.rms_norm_quantize, args)
    torch.library.opcheck(torch.ops.mx.rms_norm_quantize_both, args)
    rstd = rms_norm_reference(x, w, EPS)[1]
    torch.library.opcheck(torch.ops.mx.rms_norm_backward, (x, x, w, rstd, backend))


def test_compiles_forward_and_backward():
    def f(x, w):
        y, rstd, q, s, qt, st = rms_norm_quantize(x, w, EPS, backend="triton", colwise=True)
        return y, q, s, qt, st

    x, w = _data((32, 64), torch.bfloat16), _weight(64, torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ws = [w.clone().requires_grad_() for _ in range(2)]
    got, want = compiled(xs[0], ws[0]), f(xs[1], ws[1])
    _same_bits(got, want)
    got[0].sum().backward()
    want[0].sum().backward()
    assert torch.equal(xs[0].grad, xs[1].grad) and torch.equal(ws[0].grad, ws[1].grad)
