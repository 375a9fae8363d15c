"""The benchmarks' shared models (tools/bench/common.py) run as their docstrings say:
each input that several linears read is cast once per call, as in a converted model."""

from __future__ import annotations

import collections
import importlib.util
import pathlib
import sys

import pytest
import torch

import mx_kernels

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKENS = 96  # no layer width of the scaled-down shapes: rows tell X (and dY) casts apart


def _common():
    spec = importlib.util.spec_from_file_location("mx_bench_common", ROOT / "tools/bench/common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _small_shapes(common):
    # Llama-3-8B's widths at TP=2, divided by 32: q 64 -> 64, k/v 64 -> 16, ...
    return [
        common.LinearShape(name=s.name, style=s.style, in_features=s.in_features // 32,
                           out_features=s.out_features // 32)
        for s in common.llama3_8b_linears(2)
    ]  # fmt: skip


CASTS = ("quantize_both", "quantize_rowwise", "quantize_colwise", "fake_quantize_rowwise",
         "fake_quantize_both", "fake_quantize_colwise")  # fmt: skip


@pytest.fixture
def activation_casts(monkeypatch):
    """Counts the casts of tensors with TOKENS rows (activations) per cast name."""
    counts = collections.Counter()
    for name in CASTS:
        cast = getattr(mx_kernels, name)

        def counted(x, *args, _cast=cast, _name=name, **kwargs):
            if x.shape[0] == TOKENS:
                counts[_name] += 1
            return _cast(x, *args, **kwargs)

        counted.__name__ = name
        monkeypatch.setattr(mx_kernels, name, counted)
    return counts


@pytest.mark.parametrize("model", ["SevenLinears", "LayerPath"])
@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4"])
def test_each_shared_input_is_cast_once_per_call(model, recipe, activation_casts):
    common = _common()
    shapes = _small_shapes(common)
    cls = getattr(common, model)
    inputs = common.seven_linear_inputs if model == "SevenLinears" else common.layer_path_inputs
    bf16, mx = common.bf16_and_mx(lambda: cls(shapes, "cpu"), recipe)
    xs, grads = inputs(shapes, TOKENS, "cpu")
    outputs = mx(xs)  # forward only: the backward's casts are of dY
    # four activations reach the linears: q/k/v's, o's, gate/up's and down's inputs
    assert sum(activation_casts.values()) == 4, activation_casts
    torch.autograd.backward(outputs, grads)
    assert all(x.grad is not None for x in xs)
    for want, got in zip(bf16(xs), outputs, strict=True):
        assert got.shape == want.shape
        cos = torch.nn.functional.cosine_similarity(
            got.flatten().float(), want.flatten().float(), 0
        )
        assert cos > 0.95, f"{model} {recipe}: output cosine {cos:.3f} against bf16"
