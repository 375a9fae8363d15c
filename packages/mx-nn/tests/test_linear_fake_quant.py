"""MXLinear's fused path (fake-quantized casts + bf16 GEMMs), which runs wherever
scaled_mm would dequantize to bf16: here forced with gemm_backend="triton" on CPU
(Triton's interpreter, scaled_mm's default design dequant_bf16)."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
import torch
from torch import nn

from mx_nn import MXLinear, MXLinearConfig
from mx_nn.casts import compute_path

FUSED = MXLinearConfig(gemm_backend="triton", cast_backend="triton")
RTOL = 1e-5  # fp32 outputs of exact products: the paths differ only in summation order


def _run(module, x, grad):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(grad)
    return y, x.grad, module.weight.grad, module.bias.grad


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _modules(config, k=128, n=96):
    torch.manual_seed(0)
    ref = nn.Linear(k, n)
    fused = MXLinear.from_linear(copy.deepcopy(ref), config)
    mx_path = dataclasses.replace(config, gemm_backend="emulated", cast_backend="reference")
    emulated = MXLinear.from_linear(copy.deepcopy(ref), mx_path)
    return fused, emulated


@pytest.mark.parametrize("hp_wgrad", [False, True])
@pytest.mark.parametrize("x_shape", [(64, 128), (2, 25, 128)], ids=str)  # 50 rows: padded
def test_matches_the_mx_path(x_shape, hp_wgrad, monkeypatch, caplog):
    monkeypatch.setattr(compute_path, "_LOGGED", set())
    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    fused, emulated = _modules(dataclasses.replace(FUSED, hp_weight_grad=hp_wgrad))
    x, grad = torch.randn(x_shape), torch.randn(*x_shape[:-1], 96)
    with caplog.at_level(logging.INFO, logger="mx_nn"):
        got = _run(fused, x, grad)
    assert "fake-quantized casts + bf16 GEMMs on cpu" in caplog.text
    want = _run(emulated, x, grad)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and _rel(g, w) <= RTOL


def test_compiled_fused_path_matches_eager(monkeypatch):
    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    fused, _ = _modules(FUSED, k=64, n=64)
    x, grad = torch.randn(32, 64), torch.randn(32, 64)
    eager = _run(fused, x, grad)
    fused.zero_grad()
    torch._dynamo.reset()
    got = _run(torch.compile(fused, fullgraph=True), x, grad)
    for g, w in zip(got, eager, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)  # bias grad: reduction order


@pytest.mark.parametrize(
    "path", ["fused", "fused-values", "mx"], ids=["fused", "fused-values", "mx"]
)
def test_compile_across_shapes_turning_dynamic(path, monkeypatch):
    """A third shape makes dynamo recompile with dynamic sizes; torch 2.11 used to fail
    there (overwrite_tensor_vt_proxy) when shapes were branched on inside the layer."""
    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    config = {
        "fused": FUSED,
        "fused-values": dataclasses.replace(FUSED, save_mx_activations=False),
        "mx": dataclasses.replace(FUSED, compute_path="mx"),
    }[path]
    torch._dynamo.reset()
    for m, k, n in [(64, 64, 64), (96, 64, 128), (50, 128, 96)]:
        torch.manual_seed(0)
        module = MXLinear.from_linear(nn.Linear(k, n), config)
        x, grad = torch.randn(2, m, k), torch.randn(2, m, n)
        want = _run(module, x, grad)
        module.zero_grad()
        got = _run(torch.compile(module, fullgraph=True), x, grad)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_bf16_parameters_and_autocast(monkeypatch):
    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    fused, emulated = _modules(FUSED)
    fused_bf16, emulated_bf16 = (copy.deepcopy(m).to(torch.bfloat16) for m in (fused, emulated))
    x, grad = torch.randn(64, 128), torch.randn(64, 96)
    got = _run(fused_bf16, x.bfloat16(), grad.bfloat16())
    want = _run(emulated_bf16, x.bfloat16(), grad.bfloat16())
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16 and _rel(g, w) <= 2**-8  # one bf16 rounding apart
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fused(x)
    assert y.dtype == torch.bfloat16 and _rel(y, want[0]) <= 2**-7


# The casts of one call, X's and W's in forward, then W's along N (MX-saved) and dY's
CASTS_PER_CALL = {
    True: ["fake_quantize_rowwise_quantize_colwise", "fake_quantize_rowwise",
           "fake_quantize_colwise", "fake_quantize_both"],
    False: ["fake_quantize_both"] * 3,
}  # fmt: skip


@pytest.mark.parametrize("save_mx", [True, False], ids=["mx-saved", "values-saved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_planned_casts_equal_the_general_path(dtype, save_mx, monkeypatch):
    """The plain case runs its casts' plans directly (mx_nn.casts.fused); the general
    path, through the public functions, gives the same bits, forward and backward,
    including a second call that finds the plans made."""
    import mx_nn.casts.fused
    from mx_kernels.testing import counting_casts

    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    fused, _ = _modules(dataclasses.replace(FUSED, save_mx_activations=save_mx), k=64, n=64)
    fused = fused.to(dtype)
    x, grad = torch.randn(32, 64, dtype=dtype), torch.randn(32, 64, dtype=dtype)
    planned = []
    with counting_casts() as casts:
        for _ in range(2):
            planned.append([t.clone() for t in _run(fused, x, grad)])
            fused.zero_grad()
    assert [op for op, _ in casts] == CASTS_PER_CALL[save_mx] * 2
    assert any(c.config is fused.config for c in mx_nn.casts.fused._CASTS.values())  # planned
    with monkeypatch.context() as m:
        m.setattr("mx_nn.linear_gemms.fused_casts", lambda *args: None)
        general = _run(fused, x, grad)
    for got in planned:
        for g, w in zip(got, general, strict=True):
            assert torch.equal(g, w)
