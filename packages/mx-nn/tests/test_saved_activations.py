"""What MXLinear keeps for backward (``save_mx_activations``): on the fused path X's
columnwise cast as MX codes and scales, decoded for dW, and W itself, cast along N in
backward: the same operand values as keeping the fake-quantized ones, in less memory
(on CPU the same bits; cuBLAS may sum X's transposed values in another order)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

import mx_kernels
from mx_nn import MXLinear, MXLinearConfig, keep_weight_casts
from mx_nn.casts.layer import colwise_values, fake_quantized_input

FUSED = MXLinearConfig(compute_path="fake_quant", cast_backend="reference")


def _run(module, x, grad):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(grad)
    return y, x.grad, module.weight.grad, module.bias.grad


def _pair(config, k=128, n=96, dtype=torch.float32):
    torch.manual_seed(0)
    ref = nn.Linear(k, n).to(dtype)
    values = dataclasses.replace(config, save_mx_activations=False)
    return (MXLinear.from_linear(copy.deepcopy(ref), config),
            MXLinear.from_linear(copy.deepcopy(ref), values))  # fmt: skip


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp8_e5m2_grads", "mxfp4", "mxfp6"])
@pytest.mark.parametrize("x_shape", [(64, 128), (2, 25, 128)], ids=str)  # 50 rows: padded
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mx_saved_equals_values_saved_bit_for_bit(recipe, x_shape, dtype):
    config = MXLinearConfig.from_recipe(recipe, compute_path="fake_quant", cast_backend="reference")
    assert config.save_mx_activations  # the default
    mx_saved, values_saved = _pair(config, dtype=dtype)
    x, grad = torch.randn(x_shape, dtype=dtype), torch.randn(*x_shape[:-1], 96, dtype=dtype)
    for got, want in zip(_run(mx_saved, x, grad), _run(values_saved, x, grad), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_mx_saved_on_triton_kernels_equals_values_saved():
    # Triton's interpreter: the quantize, fake-quantize and dequantize kernels agree
    config = dataclasses.replace(FUSED, cast_backend="triton")
    mx_saved, values_saved = _pair(config, k=64, n=64, dtype=torch.bfloat16)
    x, grad = torch.randn(64, 64, dtype=torch.bfloat16), torch.randn(64, 64, dtype=torch.bfloat16)
    for got, want in zip(_run(mx_saved, x, grad), _run(values_saved, x, grad), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "fp6_e3m2"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_decoded_colwise_cast_is_the_fake_quantized_one(fmt, backend):
    if backend == "triton" and fmt.startswith("fp6"):
        pytest.skip("fp6 has no Triton dequantize (its reference runs, tested above)")
    torch.manual_seed(1)
    x = torch.randn(64, 64) * torch.logspace(-40, 3, 64).unsqueeze(1)  # bf16 subnormals too
    x = x.bfloat16()
    c = MXLinearConfig(input_fmt=fmt, compute_path="fake_quant", cast_backend=backend)
    _, saved = fake_quantized_input(x, c, colwise=True)
    assert len(saved) == 2 and saved[0].element_size() == 1  # codes, not values
    want = mx_kernels.fake_quantize_colwise(x, fmt, backend=backend)
    got = colwise_values(saved, c, torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def _saved_bytes(module, x):
    """Bytes of the tensors autograd keeps for backward, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    sizes: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            sizes[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x.detach().requires_grad_())
    return sum(sizes.values())


def test_mx_saved_keeps_about_half_the_bytes():
    mx_saved, values_saved = _pair(FUSED, k=256, n=256, dtype=torch.bfloat16)
    x = torch.randn(128, 256, dtype=torch.bfloat16)
    saved, values = _saved_bytes(mx_saved, x), _saved_bytes(values_saved, x)
    # X's codes (1 byte) and scales (1/32) against X's and W's values (2 + 2 bytes)
    assert saved == 128 * 256 * (1 + 1 / 32)
    assert values == 128 * 256 * 2 + 256 * 256 * 2


def test_kept_weight_casts_are_used_not_made_again():
    mx_saved, values_saved = _pair(FUSED)
    x, grad = torch.randn(64, 128), torch.randn(64, 96)
    want = _run(values_saved, x, grad)
    with keep_weight_casts():
        got = _run(mx_saved, x, grad)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_high_precision_weight_gradient_keeps_x():
    config = MXLinearConfig.from_recipe("mxfp8_hp_wgrad", compute_path="fake_quant",
                                        cast_backend="reference")  # fmt: skip
    mx_saved, values_saved = _pair(config)
    x, grad = torch.randn(64, 128), torch.randn(64, 96)
    for got, want in zip(_run(mx_saved, x, grad), _run(values_saved, x, grad), strict=True):
        assert torch.equal(got, want)
