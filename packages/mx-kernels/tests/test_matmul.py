"""mx_kernels.scaled_mm: every backend against a float64 reference, argument checks and
the op's registration (opcheck, torch.compile). The cuBLAS backend: test_cublas_meta.py
(its operands against PyTorch's meta functions) and test_capability.py (which device
runs what); blocked scales: test_scale_layout.py.

Triton runs under the interpreter (conftest sets TRITON_INTERPRET=1): shapes stay small.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

import mx_kernels
from mx_core import MXTensor, quantize
from mx_kernels import backend as backend_mod
from mx_kernels import scaled_mm
from mx_kernels.matmul import scaled_mm_reference

SHAPES = [(133, 512, 528), (1, 32, 32), (17, 96, 33), (256, 1024, 512)]  # M, K, N
FORMAT_PAIRS = [
    ("fp8_e4m3", "fp8_e4m3"),
    ("fp8_e5m2", "fp8_e5m2"),
    ("fp8_e4m3", "fp8_e5m2"),
    ("fp4_e2m1", "fp4_e2m1"),
    ("fp4_e2m1", "fp8_e4m3"),
]
# (backend, Triton design): each Triton design is its own implementation under test.
IMPLS = [
    ("emulated", None),
    ("triton", "dot_scaled"),
    ("triton", "fp8_mma"),
    ("triton", "dequant_bf16"),
]
IMPL_IDS = ["emulated", "triton-dot_scaled", "triton-fp8_mma", "triton-dequant_bf16"]
FP32_RTOL = 1e-5  # fp32 accumulation of exact products: ~1e-7 in practice
OUT_RTOL = {torch.bfloat16: 2**-8, torch.float16: 2**-11}  # one rounding of the result


def _operands(m, k, n, a_fmt, b_fmt, *, spread=30, seed=0):
    """Quantized x [M, K] and w [N, K] whose rows differ in magnitude by up to
    2^+-spread, so the E8M0 scales cover a wide exponent range."""
    g = torch.Generator().manual_seed(seed)

    def rows(r):
        magnitude = torch.exp2(torch.randint(-spread, spread + 1, (r, 1), generator=g).float())
        return torch.randn(r, k, generator=g) * magnitude

    return quantize(rows(m), a_fmt), quantize(rows(n), b_fmt)


def _reference(a: MXTensor, b: MXTensor) -> torch.Tensor:
    return a.dequantize(torch.float64) @ b.dequantize(torch.float64).T


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _run(a, b, impl, monkeypatch, out_dtype=torch.float32):
    backend, design = impl
    if design is not None:
        monkeypatch.setenv("MX_KERNELS_MM_DESIGN", design)
    return scaled_mm(a.qdata, a.scale, b.qdata, b.scale, out_dtype=out_dtype, backend=backend)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("a_fmt,b_fmt", FORMAT_PAIRS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matches_float64_reference(m, k, n, a_fmt, b_fmt, impl, monkeypatch):
    a, b = _operands(m, k, n, a_fmt, b_fmt)
    out = _run(a, b, impl, monkeypatch)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert _rel_err(out, _reference(a, b)) <= FP32_RTOL


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("a_fmt,b_fmt", [("fp8_e4m3", "fp8_e4m3"), ("fp4_e2m1", "fp8_e5m2")])
def test_half_precision_out(a_fmt, b_fmt, out_dtype, impl, monkeypatch):
    a, b = _operands(133, 512, 528, a_fmt, b_fmt, spread=4)  # fp16 range: keep it modest
    out = _run(a, b, impl, monkeypatch, out_dtype)
    assert out.dtype == out_dtype
    assert _rel_err(out, _reference(a, b)) <= OUT_RTOL[out_dtype]
    # The epilogue rounds the fp32 accumulator to nearest even, as torch's cast does.
    out32 = _run(a, b, impl, monkeypatch, torch.float32)
    torch.testing.assert_close(out, out32.to(out_dtype), rtol=0, atol=0)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("a_dtype,b_dtype", [(torch.float8_e4m3fn, torch.float8_e5m2)])
def test_extreme_scale_bytes(a_dtype, b_dtype, impl, monkeypatch):
    """Scale bytes drawn directly: a's from 0 (2^-127, an fp32 subnormal) to 100, b's up
    to 246, so single scales are far out of range while their products stay normal.

    Design dequant_bf16 holds the dequantized operands in bf16, whose subnormals end at
    2^-133: its a bytes start at 3, where e4m3's smallest step (2^-9) times the scale
    is still a bf16 (documented in mx_kernels.matmul_triton)."""
    m, k, n = 40, 256, 48
    low = 3 if impl[1] == "dequant_bf16" else 0
    g = torch.Generator().manual_seed(1)
    a_q = torch.randn(m, k, generator=g).mul(64).clamp(-448, 448).to(a_dtype)
    b_q = torch.randn(n, k, generator=g).mul(64).clamp(-448, 448).to(b_dtype)
    a_bytes = torch.randint(low, 101, (m, k // 32), generator=g, dtype=torch.uint8)
    a_bytes[0] = low  # a whole row of the smallest scale
    b_bytes = torch.randint(134, 247, (n, k // 32), generator=g, dtype=torch.uint8)
    e8 = torch.float8_e8m0fnu
    a = MXTensor(qdata=a_q, scale=a_bytes.view(e8), fmt=_fmt(a_dtype), block_size=32, dim=1,
                 orig_dtype=torch.float32)  # fmt: skip
    b = MXTensor(qdata=b_q, scale=b_bytes.view(e8), fmt=_fmt(b_dtype), block_size=32, dim=1,
                 orig_dtype=torch.float32)  # fmt: skip
    out = _run(a, b, impl, monkeypatch)
    ref = _reference(a, b)
    assert _rel_err(out, ref) <= FP32_RTOL
    assert _rel_err(out[0], ref[0]) <= FP32_RTOL  # the 2^-127 row on its own


def _fmt(dtype):
    return {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}[dtype]


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1"])
def test_nan_block_poisons_its_row(fmt, impl, monkeypatch):
    x, w = torch.randn(8, 64), torch.randn(16, 64)
    x[3, 32:] = float("nan")  # scale byte 255 (fp4 has no NaN code: the scale carries it)
    a, b = quantize(x, fmt), quantize(w, fmt)
    out = _run(a, b, impl, monkeypatch)
    assert out[3].isnan().all()
    assert torch.cat([out[:3], out[4:]]).isfinite().all()


def test_misaligned_base(monkeypatch):
    """A view 8 bytes into its storage still runs (the Triton launcher realigns it)."""
    a, b = _operands(4, 64, 8, "fp8_e4m3", "fp8_e4m3")
    storage = torch.empty(8 + a.qdata.numel(), dtype=torch.uint8)
    a_q = storage[8:].view(4, 64).view(torch.float8_e4m3fn)
    a_q.copy_(a.qdata)
    monkeypatch.setenv("MX_KERNELS_MM_DESIGN", "fp8_mma")
    out = scaled_mm(a_q, a.scale, b.qdata, b.scale, out_dtype=torch.float32, backend="triton")
    assert _rel_err(out, _reference(a, b)) <= FP32_RTOL


def test_float4_dtype_and_uint8_agree():
    a, b = _operands(17, 96, 33, "fp4_e2m1", "fp4_e2m1")
    as_u8 = scaled_mm(a.qdata, a.scale, b.qdata, b.scale, out_dtype=torch.float32)
    f4 = torch.float4_e2m1fn_x2
    as_f4 = scaled_mm(a.qdata.view(f4), a.scale, b.qdata.view(f4), b.scale, out_dtype=torch.float32)
    torch.testing.assert_close(as_u8, as_f4, rtol=0, atol=0)


def test_zero_sized():
    a, b = _operands(0, 64, 8, "fp8_e4m3", "fp8_e4m3")
    assert scaled_mm(a.qdata, a.scale, b.qdata, b.scale).shape == (0, 8)
    a, b = _operands(4, 64, 0, "fp8_e4m3", "fp8_e4m3")
    out = scaled_mm(a.qdata, a.scale, b.qdata, b.scale, backend="triton")
    assert out.shape == (4, 0)


# --- argument checks ------------------------------------------------------------------


def _good(m=4, k=64, n=8, a_fmt="fp8_e4m3", b_fmt="fp8_e4m3"):
    a, b = _operands(m, k, n, a_fmt, b_fmt)
    return dict(a_q=a.qdata, a_scale=a.scale, b_q=b.qdata, b_scale=b.scale)


def _with(**changes):
    args = _good()
    args.update(changes)
    return args


E8 = torch.float8_e8m0fnu
BAD_ARGS = [
    # (arguments, keyword arguments, error, message pattern naming the operand)
    (_with(a_q=torch.zeros(4, 48, dtype=torch.float8_e4m3fn),
           a_scale=torch.zeros(4, 1, dtype=E8), b_q=torch.zeros(8, 48, dtype=torch.float8_e4m3fn),
           b_scale=torch.zeros(8, 1, dtype=E8)), {}, ValueError, "K=48.*multiple of 32"),
    (_with(b_q=torch.zeros(8, 96, dtype=torch.float8_e4m3fn), b_scale=torch.zeros(8, 3, dtype=E8)),
     {}, ValueError, "a_q .*K=64.*b_q .*K=96"),
    (_with(a_scale=torch.zeros(4, 3, dtype=E8)), {}, ValueError, r"a_scale has shape \(4, 3\)"),
    (_with(b_scale=torch.zeros(2, 8, dtype=E8)), {}, ValueError, r"b_scale has shape \(2, 8\)"),
    (_with(a_scale=torch.zeros(4, 2, dtype=torch.uint8)), {}, TypeError, "a_scale has dtype"),
    (_with(b_scale=torch.zeros(8, 2)), {}, TypeError, "b_scale has dtype"),
    (_with(a_q=torch.zeros(4, 64, dtype=torch.bfloat16)), {}, TypeError, "a_q has dtype"),
    (_with(b_q=[[0.0] * 64] * 8), {}, TypeError, "b_q must be a torch.Tensor"),
    (_with(b_q=torch.zeros(64, 8, dtype=torch.float8_e4m3fn).t()), {}, ValueError,
     "b_q must be K-major"),
    (_with(a_q=torch.zeros(1, 4, 64, dtype=torch.float8_e4m3fn)), {}, ValueError,
     "a_q must be 2-D"),
    (_with(b_scale=torch.zeros(8, 2, dtype=E8, device="meta")), {}, ValueError,
     "b_scale is on meta"),
    (_good(), {"out_dtype": torch.float8_e4m3fn}, ValueError, "out_dtype"),
    (_good(), {"out_dtype": "bf16"}, TypeError, "out_dtype"),
    (_good(), {"backend": "cutlass"}, ValueError, "backend='cutlass'"),
    (_good(), {"backend": "reference"}, ValueError, "backend='reference'"),
]  # fmt: skip


@pytest.mark.parametrize("fp6", ["fp6_e2m3", "fp6_e3m2"])
def test_fp6_operands_are_named_as_fp6(fp6):
    """fp6 codes (uint8, one per element) are not read as packed fp4 with a wrong scale
    shape: the error names the operand, the format and what scaled_mm takes."""
    a6, b6 = _operands(4, 64, 8, fp6, fp6)
    a8, b8 = _operands(4, 64, 8, "fp8_e4m3", "fp8_e4m3")
    why = (
        r"holds one code per element: fp6 codes \(fp6_e2m3, fp6_e3m2\), which have no MX "
        r"GEMM\. scaled_mm takes fp8_e4m3, fp8_e5m2 and fp4_e2m1"
    )
    for args, operand in (
        ((a6.qdata, a6.scale, b8.qdata, b8.scale), r"a_q \(uint8 \(4, 64\)\) with a_scale"),
        ((a8.qdata, a8.scale, b6.qdata, b6.scale), r"b_q \(uint8 \(8, 64\)\) with b_scale"),
        ((a6.qdata, a6.scale, b6.qdata, b6.scale), r"a_q \(uint8 \(4, 64\)\) with a_scale"),
    ):
        with pytest.raises(ValueError, match=rf"scaled_mm: {operand} \(\d+, 2\) {why}"):
            scaled_mm(*args)


@pytest.mark.parametrize("args,kwargs,error,match", BAD_ARGS)
def test_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        scaled_mm(**args, **kwargs)


def test_triton_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        scaled_mm(**_good(), backend="triton")


def test_unknown_design(monkeypatch):
    monkeypatch.setenv("MX_KERNELS_MM_DESIGN", "wgmma")
    with pytest.raises(ValueError, match="MX_KERNELS_MM_DESIGN='wgmma'"):
        scaled_mm(**_good(), backend="triton")


@pytest.mark.parametrize("design", [None, "fp8_mma"])
def test_triton_design_is_logged(design, monkeypatch, caplog):
    monkeypatch.setattr(backend_mod, "LOGGED", set())
    if design is None:
        monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    else:
        monkeypatch.setenv("MX_KERNELS_MM_DESIGN", design)
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        scaled_mm(**_good(), backend="triton")
    expected = design or mx_kernels.matmul.DEFAULT_DESIGN
    assert f"scaled_mm: triton design {expected} backend on cpu" in caplog.text


def test_auto_is_emulated_on_cpu_and_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(backend_mod, "LOGGED", set())
    args = _good()
    with caplog.at_level(logging.INFO, logger="mx_kernels"):
        out = scaled_mm(**args, out_dtype=torch.float32)
        scaled_mm(**args, out_dtype=torch.float32)
    lines = [r.getMessage() for r in caplog.records if "scaled_mm" in r.getMessage()]
    assert lines == ["mx_kernels.scaled_mm: emulated backend on cpu (auto: not CUDA)"]
    expected = scaled_mm_reference(args["a_q"], args["a_scale"], args["b_q"], args["b_scale"],
                                   torch.float32)  # fmt: skip
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


# --- the op ---------------------------------------------------------------------------


def _op_args(a_fmt, b_fmt, backend):
    a, b = _operands(17, 64, 24, a_fmt, b_fmt, spread=4)
    u8 = torch.uint8
    return (a.qdata.view(u8), a.scale.view(u8), a_fmt, b.qdata.view(u8), b.scale.view(u8), b_fmt,
            torch.float32, backend)  # fmt: skip


@pytest.mark.parametrize(
    "a_fmt,b_fmt,backend",
    [("fp8_e4m3", "fp8_e5m2", "emulated"), ("fp4_e2m1", "fp8_e4m3", "emulated"),
     ("fp8_e4m3", "fp4_e2m1", "triton")],
)  # fmt: skip
def test_opcheck(a_fmt, b_fmt, backend):
    torch.library.opcheck(torch.ops.mx.scaled_mm.default, _op_args(a_fmt, b_fmt, backend))


def test_compile_fullgraph_matches_eager():
    a, b = _operands(16, 64, 32, "fp8_e4m3", "fp4_e2m1", spread=4)

    def f(a_q, a_scale, b_q, b_scale):
        return scaled_mm(a_q, a_scale, b_q, b_scale, out_dtype=torch.float32).relu()

    args = (a.qdata, a.scale, b.qdata.view(torch.float4_e2m1fn_x2), b.scale)
    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(*args), f(*args), rtol=0, atol=0)


def test_import_registers_op_without_triton_kernels():
    code = (
        "import sys, torch, mx_kernels; "
        "assert hasattr(torch.ops.mx, 'scaled_mm'); "
        "assert 'mx_kernels.matmul_triton' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_name():
    assert "scaled_mm" in mx_kernels.__all__ and mx_kernels.scaled_mm is scaled_mm


def test_compiled_scaled_mm_still_checks_shapes_at_run_time():
    """Under torch.compile the wrapper skips its shape checks; the op body raises them."""
    compiled = torch.compile(scaled_mm, fullgraph=True)
    good = _good()
    compiled(**good)
    bad = _with(
        b_q=torch.zeros(8, 96, dtype=torch.float8_e4m3fn), b_scale=torch.zeros(8, 3, dtype=E8)
    )
    with pytest.raises(ValueError, match="a_q .*K=64.*b_q .*K=96"):
        compiled(**bad)


def test_triton_that_cannot_be_imported_is_named_in_the_error(monkeypatch, fresh_backend_choices):
    monkeypatch.setattr(backend_mod, "triton_available", lambda: False)
    why = "ModuleNotFoundError: No module named 'numpy'"
    monkeypatch.setattr(backend_mod, "_triton_import_error", lambda: why)
    with pytest.raises(RuntimeError, match="needs triton, which cannot be imported.*numpy"):
        scaled_mm(**_good(), backend="triton")
    with pytest.raises(
        RuntimeError, match="quantize_rowwise: backend='triton' on cpu needs triton"
    ):
        mx_kernels.quantize_rowwise(torch.randn(2, 32), backend="triton")
