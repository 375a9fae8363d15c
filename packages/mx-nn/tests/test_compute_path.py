"""Which of MXLinear's paths runs (mx_nn.casts.compute_path): the fused path only where every
GEMM would be scaled_mm's dequant_bf16 design; forced with gemm_backend="triton" on CPU
(scaled_mm's default design there is dequant_bf16)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mx_nn import MXLinearConfig
from mx_nn.casts.compute_path import cast_kwargs, clear_decisions, fake_quant_path

FUSED = MXLinearConfig(gemm_backend="triton", cast_backend="triton")


@pytest.mark.parametrize(
    "case",
    ["fp16 input", "design fp8_mma", "fp6 weights"],
)
def test_mx_path_where_fusion_does_not_apply(case, monkeypatch):
    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    clear_decisions()  # the design variable is read when a config is first seen
    config, dtype = FUSED, torch.float32
    if case == "fp16 input":
        dtype = torch.float16
    elif case == "design fp8_mma":
        monkeypatch.setenv("MX_KERNELS_MM_DESIGN", "fp8_mma")
    else:
        config = dataclasses.replace(FUSED, weight_fmt="fp6_e2m3")
    assert not fake_quant_path(torch.device("cpu"), config, dtype)
    assert fake_quant_path(torch.device("cpu"), FUSED, torch.float32) == (case != "design fp8_mma")


@pytest.mark.parametrize("save_mx", [True, False])
def test_saving_mx_casts_keeps_the_fused_path(save_mx, monkeypatch):
    # the fused path keeps MX casts too (test_saved_activations.py): no reason to leave it
    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    clear_decisions()
    config = dataclasses.replace(FUSED, save_mx_activations=save_mx)
    assert fake_quant_path(torch.device("cpu"), config, torch.float32)


def test_design_variable_is_read_when_a_config_is_first_seen(monkeypatch):
    monkeypatch.delenv("MX_KERNELS_MM_DESIGN", raising=False)
    config, cpu = dataclasses.replace(FUSED), torch.device("cpu")
    assert fake_quant_path(cpu, config, torch.float32)
    monkeypatch.setenv("MX_KERNELS_MM_DESIGN", "fp8_mma")
    assert fake_quant_path(cpu, config, torch.float32)  # decided on the first call
    assert not fake_quant_path(cpu, config, torch.bfloat16)  # a new dtype: decided now
    clear_decisions()
    assert not fake_quant_path(cpu, config, torch.float32)


def test_auto_on_cpu_keeps_the_emulated_mx_path():
    assert not fake_quant_path(torch.device("cpu"), MXLinearConfig(), torch.float32)


def test_forced_paths():
    for path, fused in (("mx", False), ("fake_quant", True)):
        config = MXLinearConfig(compute_path=path)
        assert fake_quant_path(torch.device("cpu"), config, torch.float32) is fused


def test_decision_follows_each_config_object():
    """Cached per config object: equal-looking lookups of different configs answer
    for their own config."""
    device = torch.device("cpu")
    for _ in range(3):
        assert fake_quant_path(device, FUSED, torch.bfloat16)
        assert not fake_quant_path(
            device, dataclasses.replace(FUSED, compute_path="mx"), torch.bfloat16
        )


def test_cast_kwargs():
    config = MXLinearConfig(block_size=32, cast_backend="triton")
    want = {"block_size": 32, "scale_mode": config.scale_mode_name, "backend": "triton"}
    assert cast_kwargs(config) == want
    assert cast_kwargs(config) is cast_kwargs(config)  # made once per config object
