"""Shared helpers of the serving-export tests: tiny models in MX, and compressed-tensors'
own reading of an export (its safetensors loader and its decompressors), independent of
mx-nn's reader."""

import json
from pathlib import Path

import pytest
import torch

import mx_kernels
import mx_nn
from mx_nn.casts.compute_path import cast_kwargs
from mx_nn.models.llama import Llama, LlamaConfig

ct = pytest.importorskip("compressed_tensors", reason="the export extra (compressed-tensors)")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

HF_SHAPE = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=64)  # fmt: skip
MX_SHAPE = LlamaConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=256,
                       max_seq_len=64)  # fmt: skip
RECIPES = {"mxfp8": "mxfp8", "mxfp4": "mxfp4"}


def not_head(module, fqn: str) -> bool:
    return fqn not in ("lm_head", "output")


def mx_config(scheme: str, **overrides) -> mx_nn.MXLinearConfig:
    return mx_nn.MXLinearConfig.from_recipe(RECIPES[scheme], compute_path="fake_quant",
                                            **overrides)  # fmt: skip


def hf_llama(scheme: str, *, seed: int = 0, tied: bool = False, **overrides):
    """A tiny Hugging Face Llama, every linear but the head MX (the fused path)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**HF_SHAPE, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config)
    return mx_nn.convert(model, mx_config(scheme, **overrides), filter_fn=not_head)


def in_bf16(model):
    """A Hugging Face model in bf16 as from_pretrained makes it: RoPE's frequencies kept
    in fp32 (``model.to`` would round them to bf16)."""
    model.to(torch.bfloat16)
    model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
    return model


def mx_llama(scheme: str, *, seed: int = 0, **overrides) -> Llama:
    """mx-train's Llama, every linear but ``output`` MX (the fused path)."""
    torch.manual_seed(seed)
    return mx_nn.convert(Llama(MX_SHAPE), mx_config(scheme, **overrides), filter_fn=not_head)


def training_values(layer: mx_nn.MXLinear, compute_dtype=torch.bfloat16) -> torch.Tensor:
    """The weight values the training forward multiplies with (its fused path's cast)."""
    w = layer.weight.detach().to(compute_dtype)
    return mx_kernels.fake_quantize_rowwise(w, layer.config.weight_fmt.value,
                                            **cast_kwargs(layer.config))  # fmt: skip


def read_folder(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an export, read by the safetensors package."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        out.update(safetensors_torch.load_file(str(folder / file)))
    assert set(out) == set(index["weight_map"])
    return out


def decompressed(folder: Path) -> dict[str, torch.Tensor]:
    """module name -> the weight compressed-tensors decompresses from the export."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig

    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    qc = QuantizationConfig.model_validate(config)
    (scheme,) = qc.config_groups.values()
    compressor = BaseCompressor.get_value_from_registry(qc.format)
    tensors = read_folder(folder)
    out = {}
    for name in tensors:
        if name.endswith(".weight_scale"):
            module = name.removesuffix(".weight_scale")
            local = {
                k.removeprefix(module + "."): v
                for k, v in tensors.items()
                if k.startswith(module + ".") and k.count(".") == module.count(".") + 1
            }
            out[module] = compressor.decompress(local, scheme)["weight"]
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns (tells -0.0 from 0.0)."""
    return t.to(torch.float32).view(torch.int32)


def load_hf(folder: Path):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    model.eval()
    return model


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))
