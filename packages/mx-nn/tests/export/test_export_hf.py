"""``mx_nn.export.export`` in one process: compressed-tensors decompresses the export into
the very weight values training multiplied with, bit for bit, and
``AutoModelForCausalLM.from_pretrained`` loads it and computes the MX model's logits."""

import json
import sys
from pathlib import Path

import pytest
import torch

import mx_kernels
import mx_nn
from mx_nn.casts.compute_path import cast_kwargs
from mx_nn.export import export
from mx_nn.export.llama_names import hf_module, rope_heads, rope_rows

sys.path.insert(0, str(Path(__file__).parent))
from export_helpers import (  # noqa: E402
    bits,
    decompressed,
    hf_llama,
    in_bf16,
    load_hf,
    mx_llama,
    read_folder,
    training_values,
)

SCHEMES = ["mxfp8", "mxfp4"]
TOKENS = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_decompressed_weights_are_the_training_casts_bit_for_bit(tmp_path, scheme):
    model = hf_llama(scheme)
    export(model, tmp_path / "out", scheme)
    weights = decompressed(tmp_path / "out")
    layers = {n: m for n, m in model.named_modules() if isinstance(m, mx_nn.MXLinear)}
    assert set(weights) == set(layers) and len(layers) == 14
    for name, layer in layers.items():
        assert torch.equal(bits(weights[name]), bits(training_values(layer))), name
    # The stored tensors are the training cast's codes and scales, in compressed-tensors'
    # names and dtypes; everything else as it is (fp32 here).
    stored = read_folder(tmp_path / "out")
    layer = layers["model.layers.1.mlp.down_proj"]
    codes, scale = mx_kernels.quantize_both(layer.weight.detach().bfloat16(),
                                            layer.config.weight_fmt.value,
                                            **cast_kwargs(layer.config))[:2]  # fmt: skip
    name = "weight" if scheme == "mxfp8" else "weight_packed"
    got = stored[f"model.layers.1.mlp.down_proj.{name}"]
    assert got.dtype == (torch.float8_e4m3fn if scheme == "mxfp8" else torch.uint8)
    assert torch.equal(got.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(stored["model.layers.1.mlp.down_proj.weight_scale"], scale.view(torch.uint8))
    assert torch.equal(stored["lm_head.weight"], model.lm_head.weight.detach())
    assert stored["model.norm.weight"].dtype == torch.float32


def test_config_index_and_shards(tmp_path):
    model = hf_llama("mxfp8")
    export(model, tmp_path / "out", "mxfp8", max_shard_bytes=200_000)
    folder = tmp_path / "out"
    config = json.loads((folder / "config.json").read_text())
    q = config["quantization_config"]
    assert q["format"] == "mxfp8-quantized" and q["quant_method"] == "compressed-tensors"
    assert q["quantization_status"] == "compressed"
    group = q["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"] and group["weights"]["group_size"] == 32
    assert group["input_activations"]["dynamic"] is True
    assert q["ignore"] == ["model.embed_tokens", "lm_head"]
    assert config["dtype"] == "bfloat16" and config["architectures"] == ["LlamaForCausalLM"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in read_folder(folder).values()
    )
    assert (folder / "generation_config.json").is_file()  # the model came with one
    # A module's codes and scales stay in one shard.
    wm = index["weight_map"]
    assert all(wm[k] == wm[k.replace("weight_scale", "weight")] for k in wm if "scale" in k)
    assert not list(tmp_path.glob(".out.partial-*"))


@pytest.mark.parametrize(("scheme", "mode"), [("mxfp8", "rceil"), ("mxfp4", "even")])
def test_from_pretrained_logits_equal_the_mx_model(tmp_path, scheme, mode):
    """Same model code, same weights; compressed-tensors casts the activations with its
    own scale rule, which is RCEIL for e4m3 (but at an amax mantissa of exactly 1.75)
    and EVEN for e2m1: with those, the logits agree bit for bit."""
    model = in_bf16(hf_llama(scheme, scale_mode=mode))
    export(model, tmp_path / "out", scheme)
    served = load_hf(tmp_path / "out")
    assert type(served.model.layers[0].mlp.up_proj) is torch.nn.Linear
    with torch.no_grad():
        got, want = served(TOKENS).logits, model(TOKENS).logits
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_mxfp4_rceil_serves_with_other_activation_scales(tmp_path):
    """The mxfp4 recipe trains RCEIL activation scales; compressed-tensors serves EVEN
    ones (README, "Serving export"): the logits then differ by the casts' rounding."""
    model = in_bf16(hf_llama("mxfp4"))
    export(model, tmp_path / "out", "mxfp4")
    with torch.no_grad():
        got, want = load_hf(tmp_path / "out")(TOKENS).logits.float(), model(TOKENS).logits.float()
    rel = ((got - want).norm() / want.norm()).item()
    assert 0 < rel < 0.3, rel


def _plain_copy(model: mx_nn.models.Llama, compute_dtype) -> mx_nn.models.Llama:
    """A high-precision Llama holding the MX layers' training weight values and, as the
    served model (dtype bfloat16) holds them, the other weights rounded to bf16."""
    plain = mx_nn.models.Llama(model.config)
    plain.load_state_dict({k: v.bfloat16().float() for k, v in model.state_dict().items()})
    for name, m in model.named_modules():
        if isinstance(m, mx_nn.MXLinear):
            plain.get_submodule(name).weight.data = training_values(m, compute_dtype).float()
    return plain


@pytest.mark.parametrize("scheme", SCHEMES)
def test_mx_llama_loads_as_hugging_face_llama(tmp_path, scheme):
    """mx-train's Llama under Hugging Face names (RoPE rows reordered): in fp32, without
    activation casts, the served model is the trained one with its MX weight values."""
    model = mx_llama(scheme)
    export(model, tmp_path / "out", scheme)
    served = load_hf(tmp_path / "out")
    assert served.config.rope_parameters["rope_theta"] == model.config.rope_theta
    with torch.no_grad():
        served(TOKENS[:, :4])  # compressed-tensors decompresses on the first forward
    for p in served.parameters():
        p.data = p.data.float()  # (transformers refuses .float() of a quantized model)
    for m in served.modules():
        m.quantization_enabled = False  # compressed-tensors' switch for its activation casts
    weights = decompressed(tmp_path / "out")
    for name, m in model.named_modules():
        if isinstance(m, mx_nn.MXLinear):
            want = training_values(m)
            heads = rope_heads(f"{name}.weight", model.config)
            if heads:
                want = want[rope_rows(heads, want.shape[0] // heads)]
            assert torch.equal(bits(weights[hf_module(name)]), bits(want)), name
    with torch.no_grad():
        got = served(TOKENS).logits
        want = _plain_copy(model, torch.bfloat16)(TOKENS)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("scheme", "tolerance"), [("mxfp8", 0.05), ("mxfp4", 0.2)])
def test_mx_llama_served_logits_within_tolerance(tmp_path, scheme, tolerance):
    """As served (bf16 everywhere, compressed-tensors' activation casts) against the MX
    model's own forward under bf16 autocast (fp32 embeddings, norms and residual):
    relative L2 distance of the logits within 5% (mxfp8; 2.1% measured) / 20% (mxfp4; 9.8%
    measured: the recipe casts activations with RCEIL, compressed-tensors with EVEN)."""
    model = mx_llama(scheme)
    export(model, tmp_path / "out", scheme)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        want = model(TOKENS).float()
    with torch.no_grad():
        got = load_hf(tmp_path / "out")(TOKENS).logits.float()
    rel = ((got - want).norm() / want.norm()).item()
    print(f"{scheme}: relative L2 distance of the served logits {rel:.4f}")
    assert rel < tolerance, rel


def test_tied_embeddings(tmp_path):
    model = hf_llama("mxfp8", tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    export(model, tmp_path / "out", "mxfp8")
    stored = read_folder(tmp_path / "out")
    assert "lm_head.weight" not in stored  # tied again on load (tie_word_embeddings)
    served = load_hf(tmp_path / "out")
    assert served.lm_head.weight.data_ptr() == served.model.embed_tokens.weight.data_ptr()
    assert torch.equal(served.model.embed_tokens.weight.float(),
                       model.model.embed_tokens.weight.detach().bfloat16().float())  # fmt: skip


def test_compute_dtype_float32_is_the_cast_of_the_fp32_weight(tmp_path):
    model = hf_llama("mxfp4")
    export(model, tmp_path / "out", "mxfp4", compute_dtype=torch.float32)
    layer = model.model.layers[0].self_attn.q_proj
    got = decompressed(tmp_path / "out")["model.layers.0.self_attn.q_proj"]
    assert torch.equal(bits(got), bits(training_values(layer, torch.float32)))
    assert not torch.equal(bits(got), bits(training_values(layer, torch.bfloat16)))


def test_mx_nn_export_model_is_the_function():
    assert mx_nn.export_model is export and mx_nn.export.export is export
