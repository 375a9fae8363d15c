"""Import: ``load_pretrained`` puts an export back into an MX model for more training,
codes preserved: the loaded weight's training cast gives the stored codes and scales
bit for bit, so an export of the loaded model is the same bytes."""

import sys
from pathlib import Path

import pytest
import torch

import mx_nn
from mx_nn.export import export, load_pretrained
from mx_nn.export.weights import dequantized, weight_codes

sys.path.insert(0, str(Path(__file__).parent))
from export_helpers import hf_llama, mx_llama, read_folder  # noqa: E402

SCHEMES = ["mxfp8", "mxfp4"]


def _shards(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.safetensors"))}


def _layers(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, mx_nn.MXLinear)}


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("build", [hf_llama, mx_llama], ids=["hf", "mx_llama"])
def test_codes_come_back_and_reexport_is_the_same_bytes(tmp_path, scheme, build):
    trained = build(scheme, seed=0)
    export(trained, tmp_path / "a", scheme)
    fresh = build(scheme, seed=1)  # other weights, same structure
    assert load_pretrained(fresh, tmp_path / "a") is fresh
    for name, layer in _layers(fresh).items():
        want = weight_codes(_layers(trained)[name].weight, layer.config, torch.bfloat16, name)
        got = weight_codes(layer.weight, layer.config, torch.bfloat16, name)
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)), name
        assert torch.equal(got[1], want[1]), name
    export(fresh, tmp_path / "b", scheme)
    assert _shards(tmp_path / "b") == _shards(tmp_path / "a")


def test_the_loaded_mx_model_computes_what_the_trained_one_did(tmp_path):
    trained = mx_llama("mxfp8")
    export(trained, tmp_path / "a", "mxfp8")
    fresh = load_pretrained(mx_llama("mxfp8", seed=1), tmp_path / "a")
    tokens = torch.randint(0, 256, (2, 32))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(fresh(tokens), trained(tokens))
    # and trains on: a step moves the weights off the served codes
    loss = fresh(tokens).float().logsumexp(-1).mean()
    loss.backward()
    assert fresh.layers[0].attention.wq.weight.grad is not None


@pytest.mark.parametrize("scheme", SCHEMES)
def test_without_preserve_codes_the_weight_is_the_dequantized_values(tmp_path, scheme):
    trained = hf_llama(scheme)
    export(trained, tmp_path / "a", scheme)
    fresh = load_pretrained(hf_llama(scheme, seed=1), tmp_path / "a", preserve_codes=False)
    stored = read_folder(tmp_path / "a")
    codes_name = "weight" if scheme == "mxfp8" else "weight_packed"
    moved = 0
    for name, layer in _layers(fresh).items():
        codes, scale = stored[f"{name}.{codes_name}"], stored[f"{name}.weight_scale"]
        fmt = layer.config.weight_fmt.value
        assert torch.equal(layer.weight.detach(), dequantized(codes, scale, fmt))
        again = weight_codes(layer.weight, layer.config, torch.bfloat16, name)
        # The same values, but RCEIL casts some blocks to a scale one lower, codes doubled.
        assert torch.equal(dequantized(*again, fmt), layer.weight.detach())
        moved += int((again[1] != scale).sum())
    assert moved > 0


def _hp_layer_model(scheme: str, seed: int = 0):
    model = hf_llama(scheme, seed=seed)
    layer = model.model.layers[0].mlp.down_proj
    plain = torch.nn.Linear(layer.in_features, layer.out_features, bias=False)
    plain.weight = layer.weight
    model.model.layers[0].mlp.down_proj = plain
    return model


def test_mx_in_the_checkpoint_high_precision_in_the_model(tmp_path):
    export(hf_llama("mxfp8"), tmp_path / "a", "mxfp8")
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.down_proj' are stored in mxfp8 "
                       r"but high precision in the model: convert them too"):  # fmt: skip
        load_pretrained(_hp_layer_model("mxfp8", seed=1), tmp_path / "a")


def test_high_precision_in_the_checkpoint_mx_in_the_model(tmp_path):
    export(_hp_layer_model("mxfp8"), tmp_path / "a", "mxfp8")
    fresh = hf_llama("mxfp8", seed=1)
    before = fresh.model.layers[1].mlp.up_proj.weight.detach().clone()
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.down_proj' are MX in the model "
                       r"but stored in high precision"):  # fmt: skip
        load_pretrained(fresh, tmp_path / "a")
    assert torch.equal(fresh.model.layers[1].mlp.up_proj.weight, before)  # nothing loaded


def test_another_format_or_shape_is_refused(tmp_path):
    export(mx_llama("mxfp8"), tmp_path / "a", "mxfp8")
    with pytest.raises(ValueError, match="scheme='mxfp8' stores fp8_e4m3 weights, but 14"):
        load_pretrained(mx_llama("mxfp4"), tmp_path / "a")
    other = mx_nn.models.LlamaConfig(dim=128, n_layers=1, n_heads=4, n_kv_heads=2,
                                     hidden_dim=256, max_seq_len=64)  # fmt: skip
    small = mx_nn.convert(mx_nn.models.Llama(other), "mxfp8", filter_fn=lambda m, f: f != "output")
    with pytest.raises(ValueError, match="config.json describes"):
        load_pretrained(small, tmp_path / "a")
    with pytest.raises(ValueError, match="holds no config.json"):
        load_pretrained(mx_llama("mxfp8"), tmp_path)
