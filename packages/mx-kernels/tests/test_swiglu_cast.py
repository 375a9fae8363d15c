"""SwiGLU + MX cast (mx_kernels.swiglu_cast): the Triton kernel under the interpreter
against torch's ``F.silu(gate) * up`` and the casts.

Exactness, as the module states it: the codes and scales equal ``quantize_rowwise`` /
``quantize_both`` of the kernel's own h bit for bit; h follows torch's rounding steps
bit for bit given the same fp32 exp (checked against those steps with numpy's exp,
which the interpreter runs); against torch's CPU silu, whose vectorised exp differs in
the last bit, h is within 1 ulp (fp32: 4) and bf16/fp16 rarely differ at all. The
backward is torch's autograd of the reference, bit for bit.
"""

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mx_core
import mx_kernels
from mx_kernels.cast_launch import empty_cast
from mx_kernels.swiglu_cast import swiglu_backward, swiglu_quantize, swiglu_reference
from mx_kernels.swiglu_cast_triton import swiglu_cast_triton

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


def _u8(t):
    return t.detach().contiguous().view(torch.uint8)


def _same_bits(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(_u8(g), _u8(w))


def _inputs(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gate = 4 * torch.randn(shape, generator=gen, dtype=torch.float64)
    up = torch.randn(shape, generator=gen, dtype=torch.float64)
    up = up * torch.exp2(torch.randint(-8, 8, shape[:-1], generator=gen)).unsqueeze(-1)
    return gate.to(dtype), up.to(dtype)


def _torch_steps(gate, up):
    """h by torch's rounding steps with numpy's fp32 exp (the interpreter's): silu in
    fp32 rounded to the dtype, then the product rounded to the dtype."""
    g = gate.float().numpy()
    silu = g / (np.float32(1) + np.exp(-g))  # numpy keeps fp32, IEEE division
    s = torch.from_numpy(silu).to(gate.dtype)
    return (s.float() * up.float()).to(gate.dtype)


def _ulps(a, b):
    """Largest distance in units in the last place between same-signed float tensors,
    where not both NaN."""
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    d = (a.view(ints).long() - b.view(ints).long()).abs()
    return d[~(a.isnan() & b.isnan())].max().item()


def _check(gate, up, fmt, mode, colwise):
    outs = swiglu_quantize(gate, up, fmt, scale_mode=mode, backend="triton", colwise=colwise)
    h = outs[0]
    assert h.dtype == gate.dtype and h.shape == gate.shape and h.is_contiguous()
    _same_bits([h], [_torch_steps(gate, up)])  # bits: NaN included
    assert _ulps(h, swiglu_reference(gate, up)) <= (4 if gate.dtype == torch.float32 else 1)
    if colwise:
        k = gate.shape[-1]
        want = mx_kernels.quantize_both(h.reshape(-1, k), fmt, scale_mode=mode, backend="reference")
        _same_bits(outs[1:], want)
        for got, w in zip(outs[1:], want, strict=True):  # the layouts too
            assert got.t().is_contiguous() == w.t().is_contiguous()
    else:
        q = mx_core.quantize(h, fmt, scale_mode=mode)
        _same_bits(outs[1:], (q.qdata, q.scale))
    return outs


@pytest.mark.parametrize("fmt, mode, dtype", COMBOS, ids=str)
def test_formats_modes_and_dtypes(fmt, mode, dtype):
    """Rowwise for each combination (5 rows: not a multiple of the tile); both casts for
    each in bf16 (the other dtypes in test_shapes)."""
    _check(*_inputs((5, 64), dtype), fmt, mode, colwise=False)
    if dtype == torch.bfloat16:
        _check(*_inputs((32, 32), dtype, seed=2), fmt, mode, colwise=True)


@pytest.mark.parametrize(
    "shape, colwise, dtype",
    [
        ((2, 4096), False, torch.bfloat16),
        ((2, 3, 160), False, torch.float16),
        ((2, 16, 96), True, torch.float16),
        ((64, 32), True, torch.float32),
        ((1, 32), False, torch.bfloat16),
    ],
    ids=str,
)
def test_shapes(shape, colwise, dtype):
    """K up to 4096, K not a multiple of the tile, folded leading dims (the columnwise
    cast of the [M, K] fold), several row tiles, one row."""
    _check(*_inputs(shape, dtype), "fp8_e4m3", "rceil", colwise)


def test_bf16_and_fp16_equal_torch_on_these_inputs():
    """Where the two exps agree after rounding (nearly always for 16-bit outputs), h is
    torch's own F.silu(gate) * up, bit for bit."""
    for dtype in (torch.bfloat16, torch.float16):
        gate, up = _inputs((8, 256), dtype, seed=4)
        h, *_ = swiglu_quantize(gate, up, backend="triton")
        assert torch.equal(h, F.silu(gate) * up)


def test_strided_inputs_and_other_tiles():
    gate, up = _inputs((64, 40), torch.bfloat16)
    _check(gate.t(), up.t(), "fp4_e2m1", "even", colwise=False)  # [40, 64], strided along K
    f = mx_core.get_format("fp8_e5m2")
    gate, up = _inputs((6, 128), torch.float16)
    h = torch.empty_like(gate)
    q, s = empty_cast(gate.shape, f, 32, "cpu")
    swiglu_cast_triton(gate, up, f, 32, "floor", h, q, s, tile=(4, 32, 2))
    assert torch.equal(h, _torch_steps(gate, up))
    want = mx_core.quantize(h, "fp8_e5m2", scale_mode="floor")
    _same_bits((q, s), (want.qdata, want.scale))


def test_special_values():
    """Inf and NaN in gate or up: h as torch's steps give it, NaN blocks get the NaN scale."""
    gate, up = _inputs((2, 64), torch.float32)
    gate[0, 3], gate[0, 40], up[1, 5] = float("inf"), float("-inf"), float("nan")
    gate[1, 50] = 0.0
    outs = _check(gate, up, "fp8_e4m3", "rceil", colwise=False)
    assert torch.isnan(outs[0][1, 5]) and outs[2].view(torch.uint8)[1, 0] == 255


def test_reference_backend_is_torch_and_the_cast():
    gate, up = _inputs((4, 64), torch.bfloat16)
    h, q, s = swiglu_quantize(gate, up, "fp6_e3m2", backend="reference")
    assert torch.equal(h, F.silu(gate) * up)
    want = mx_core.quantize(h, "fp6_e3m2")
    _same_bits((q, s), (want.qdata, want.scale))


def test_auto_on_cpu_is_the_reference_and_says_so(caplog):
    gate, up = _inputs((4, 64), torch.float32)
    mx_kernels.backend.LOGGED.clear()
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        swiglu_quantize(gate, up)
        swiglu_quantize(gate, up)
    lines = [r.getMessage() for r in caplog.records if "swiglu_quantize" in r.getMessage()]
    assert lines == [
        "mx_kernels.swiglu_quantize: reference backend on cpu (auto: not a CUDA tensor)"
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_is_torch_autograd_bit_for_bit(dtype):
    gate, up = _inputs((3, 5, 64), dtype)
    dh = _inputs((3, 5, 64), dtype, seed=6)[0]
    g1, u1 = gate.clone().requires_grad_(), up.clone().requires_grad_()
    h, *_ = swiglu_quantize(g1, u1, backend="triton", colwise=False)
    h.backward(dh)
    g2, u2 = gate.clone().requires_grad_(), up.clone().requires_grad_()
    swiglu_reference(g2, u2).backward(dh)
    assert torch.equal(g1.grad, g2.grad) and torch.equal(u1.grad, u2.grad)
    d_gate, d_up = swiglu_backward(dh, gate, up)
    assert torch.equal(d_gate, g2.grad) and torch.equal(d_up, u2.grad)


def _bad(**kw):
    args = dict(gate=torch.zeros(2, 32), up=torch.zeros(2, 32)) | kw
    return lambda: swiglu_quantize(args.pop("gate"), args.pop("up"), **args)


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (
            _bad(gate=torch.zeros(2, 48), up=torch.zeros(2, 48)),
            ValueError,
            "has size 48, which is not divisible by block_size=32",
        ),
        (_bad(gate=torch.zeros(2, 32, dtype=torch.int8)), TypeError, "x has dtype torch.int8"),
        (
            _bad(up=torch.zeros(2, 64)),
            ValueError,
            r"up \(\(2, 64\), torch.float32, cpu\) must match gate",
        ),
        (_bad(up=torch.zeros(2, 32, dtype=torch.bfloat16)), ValueError, "must match gate"),
        (_bad(up=None), TypeError, "up must be a torch.Tensor, got NoneType"),
        (_bad(fmt="fp16"), ValueError, "fmt='fp16' is not an MX element format"),
        (_bad(scale_mode="x"), ValueError, "scale_mode='x' is not a scale mode"),
        (_bad(backend="cuda"), ValueError, "backend='cuda' is not one of auto, triton, reference"),
        (_bad(colwise="yes"), TypeError, "colwise must be a bool, got 'yes'"),
        (_bad(colwise=True), ValueError, "colwise=True .* M=2, which is not divisible by"),
        (
            _bad(gate=torch.zeros(2, 36), up=torch.zeros(2, 36), block_size=6, backend="triton"),
            ValueError,
            "block_size=6 has no Triton kernel",
        ),
    ],
)
def test_bad_input(call, exc, message):
    with pytest.raises(exc, match=f"swiglu_quantize: .*{message}"):
        call()


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_opcheck(backend):
    gate, up = _inputs((32, 32), torch.bfloat16)
    args = (gate, up, "fp8_e4m3", 32, "rceil", backend)
    torch.library.opcheck(torch.ops.mx.swiglu_quantize, args)
    torch.library.opcheck(torch.ops.mx.swiglu_quantize_both, args)


def test_compiles_forward_and_backward():
    def f(gate, up):
        return swiglu_quantize(gate, up, "fp4_e2m1", backend="triton", colwise=True)

    gate, up = _inputs((32, 64), torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    ins = [(gate.clone().requires_grad_(), up.clone().requires_grad_()) for _ in range(2)]
    got, want = compiled(*ins[0]), f(*ins[1])
    _same_bits(got, want)
    got[0].sum().backward()
    want[0].sum().backward()
    assert torch.equal(ins[0][0].grad, ins[1][0].grad)
    assert torch.equal(ins[0][1].grad, ins[1][1].grad)
