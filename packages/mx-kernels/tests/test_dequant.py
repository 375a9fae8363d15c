"""mx_kernels.dequantize_rowwise: Triton (interpreter) bit-exact with MXTensor.dequantize,
the reference for what Triton does not cover, argument checks, opcheck and compile."""

from __future__ import annotations

import logging

import pytest
import torch

import mx_core
import mx_kernels
from mx_core.testing import assert_same_bits, semantic_inputs

TRITON_FMTS = ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1"]
OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _data(shape, seed=0, spread=20):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    return x * torch.exp2(torch.randint(-spread, spread + 1, shape[:-1], generator=g)).unsqueeze(-1)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("fmt", TRITON_FMTS)
@pytest.mark.parametrize("shape", [(1, 32), (33, 64), (2, 17, 96), (5, 544)], ids=str)
def test_bit_exact(shape, fmt, out_dtype):
    spread = 4 if out_dtype == torch.float16 else 20  # fp16: stay inside its range
    t = mx_core.quantize(_data(shape, spread=spread), fmt)
    got = mx_kernels.dequantize_rowwise(t.qdata, t.scale, fmt, out_dtype=out_dtype,
                                        backend="triton")  # fmt: skip
    assert_same_bits(got, t.dequantize(out_dtype))


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_columnwise_cast_round_trip(backend):
    """quantize_colwise's column-major scale_t dequantizes like a row-major one."""
    x = _data((96, 64), seed=3).to(torch.bfloat16)
    q_t, s_t = mx_kernels.quantize_colwise(x, backend=backend)
    got = mx_kernels.dequantize_rowwise(q_t, s_t, "fp8_e4m3", backend=backend)
    assert_same_bits(got, mx_core.quantize(x.t().contiguous()).dequantize(torch.bfloat16))


@pytest.mark.parametrize("fmt", TRITON_FMTS)
def test_semantics_table_and_nan_blocks(fmt):
    x = semantic_inputs(fmt, torch.float32)  # includes NaN and Inf blocks: scale 255
    t = mx_core.quantize(x, fmt)
    for dtype in (torch.float32, torch.bfloat16):
        got = mx_kernels.dequantize_rowwise(t.qdata, t.scale, fmt, out_dtype=dtype,
                                            backend="triton")  # fmt: skip
        assert_same_bits(got, t.dequantize(dtype))


@pytest.mark.parametrize("block_size", [16, 64])
def test_other_block_sizes(block_size):
    t = mx_core.quantize(_data((9, 256)), "fp8_e4m3", block_size=block_size)
    got = mx_kernels.dequantize_rowwise(
        t.qdata, t.scale, "fp8_e4m3", block_size=block_size, out_dtype=torch.float32,
        backend="triton",
    )  # fmt: skip
    assert_same_bits(got, t.dequantize(torch.float32))


def test_every_scale_byte():
    """Each E8M0 byte 0..255 on an all-ones e4m3 row: 2^-127 (fp32 subnormal) to NaN."""
    codes = torch.ones(256, 32).to(torch.float8_e4m3fn)
    scale = torch.arange(256, dtype=torch.uint8).view(torch.float8_e8m0fnu).unsqueeze(1)
    want = mx_core.MXTensor(qdata=codes, scale=scale, fmt="fp8_e4m3", block_size=32, dim=1,
                            orig_dtype=torch.float32).dequantize()  # fmt: skip
    got = mx_kernels.dequantize_rowwise(codes, scale, out_dtype=torch.float32, backend="triton")
    assert_same_bits(got, want)


def test_fp6_runs_the_reference_when_auto_and_says_so(caplog, monkeypatch):
    monkeypatch.setattr("mx_kernels.backend.LOGGED", set())
    t = mx_core.quantize(_data((4, 64)), "fp6_e2m3")
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        got = mx_kernels.dequantize_rowwise(t.qdata, t.scale, "fp6_e2m3",
                                            out_dtype=torch.float32)  # fmt: skip
    assert_same_bits(got, t.dequantize(torch.float32))
    assert "dequantize_rowwise: reference backend on cpu" in caplog.text
    with pytest.raises(ValueError, match="fp6_e2m3 has no Triton dequantize"):
        mx_kernels.dequantize_rowwise(t.qdata, t.scale, "fp6_e2m3", backend="triton")


def test_float4_storage_dtype_is_accepted():
    t = mx_core.quantize(_data((3, 64)), "fp4_e2m1")
    packed = t.qdata.view(torch.float4_e2m1fn_x2)
    got = mx_kernels.dequantize_rowwise(packed, t.scale, "fp4_e2m1", out_dtype=torch.float32,
                                        backend="triton")  # fmt: skip
    assert_same_bits(got, t.dequantize(torch.float32))


_T = mx_core.quantize(torch.randn(4, 64), "fp8_e4m3")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(scale=_T.scale.view(torch.uint8)), "scale has dtype torch.uint8"),
        (dict(scale=_T.scale[:, :1]), r"scale has shape \(4, 1\) but qdata \(4, 64\)"),
        (dict(block_size=0), "block_size=0"),
        (dict(block_size=48), "with block_size=48 needs"),
        (dict(out_dtype=torch.float64), "out_dtype=torch.float64 is not supported"),
        (dict(backend="cuda"), "backend='cuda' is not one of"),
        (dict(qdata=_T.qdata.float()), "qdata has dtype torch.float32"),
    ],
)
def test_bad_input(kwargs, message):
    args = dict(qdata=_T.qdata, scale=_T.scale, fmt="fp8_e4m3")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        mx_kernels.dequantize_rowwise(**args)


@pytest.mark.parametrize("block_size", [True, 32.0])
def test_block_size_must_be_an_int_not_a_bool(block_size):
    """``block_size=True`` was taken as 1 (a shape error naming block_size=True)."""
    with pytest.raises(TypeError, match="dequantize_rowwise: block_size must be an int, got"):
        mx_kernels.dequantize_rowwise(_T.qdata, _T.scale, block_size=block_size)
    with pytest.raises(ValueError, match="block_size=3 must be a positive multiple of 2"):
        mx_kernels.dequantize_rowwise(_T.qdata, _T.scale, block_size=3)


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_opcheck(backend):
    q, s = _T.qdata.view(torch.uint8), _T.scale.view(torch.uint8)
    torch.library.opcheck(torch.ops.mx.dequantize_rowwise,
                          (q, s, "fp8_e4m3", 32, torch.bfloat16, backend))  # fmt: skip


def test_compiles_without_graph_breaks():
    def f(x):
        q, s = mx_kernels.quantize_rowwise(x, backend="triton")
        return mx_kernels.dequantize_rowwise(q, s, backend="triton")

    x = _data((32, 96))
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    assert_same_bits(compiled(x), f(x))
