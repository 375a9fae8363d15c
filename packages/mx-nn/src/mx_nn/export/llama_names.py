"""mx-train's :class:`mx_nn.models.llama.Llama` under Hugging Face ``LlamaForCausalLM``
names, with its ``LlamaConfig``::

    mx_nn.models.llama                 Hugging Face LlamaForCausalLM
    tok_embeddings                     model.embed_tokens
    layers.<i>.attention_norm          model.layers.<i>.input_layernorm
    layers.<i>.attention.wq/wk/wv/wo   model.layers.<i>.self_attn.q/k/v/o_proj
    layers.<i>.ffn_norm                model.layers.<i>.post_attention_layernorm
    layers.<i>.feed_forward.w1/w3/w2   model.layers.<i>.mlp.gate/up/down_proj
    norm                               model.norm
    output                             lm_head

RoPE: mx-nn's Llama rotates consecutive feature pairs (2j, 2j + 1) of each head by the
angle of frequency j; Hugging Face's rotates features j and j + head_dim / 2. So the
rows of q_proj and k_proj are reordered within each head, even features first, then
odd ones (:func:`rope_rows`); q and k move alike, so every attention score is the same.
MX blocks run along the input features, so reordering rows moves whole blocks: the
codes and scales are those of the training cast, rows reordered.
"""

from __future__ import annotations

import re

import torch

from mx_nn.models.llama import LlamaConfig

__all__ = ["hf_config", "hf_key", "hf_module", "mx_config", "rope_heads", "rope_rows"]

_BLOCK = {
    "attention_norm": "input_layernorm",
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
}
_ROOT = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def hf_module(fqn: str) -> str:
    """The Hugging Face module name of an mx-nn Llama module.

    Args:
        fqn: the module's name in :class:`mx_nn.models.llama.Llama` (``layers.0.attention.wq``).
    Returns:
        Its ``LlamaForCausalLM`` name (``model.layers.0.self_attn.q_proj``; module doc).
    Raises:
        ValueError: a module the table (module doc) does not name.
    """
    if fqn in _ROOT:
        return _ROOT[fqn]
    m = _LAYER.match(fqn)
    if m and m.group(2) in _BLOCK:
        return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}"
    raise ValueError(f"mx_nn.models.llama.Llama has no module {fqn!r} with a Hugging Face name")


def hf_key(key: str) -> str:
    """The Hugging Face state-dict key of an mx-nn Llama key.

    Args:
        key: ``<module>.<leaf>`` in mx-nn names (``layers.0.attention.wq.weight``).
    Returns:
        The same leaf under :func:`hf_module`'s name.
    Raises:
        ValueError: as :func:`hf_module`.
    """
    module, _, leaf = key.rpartition(".")
    return f"{hf_module(module)}.{leaf}"


def rope_heads(key: str, config: LlamaConfig) -> int:
    """Heads whose rows :func:`rope_rows` reorders in a tensor.

    Args:
        key: the tensor's state-dict key, mx-nn names.
        config: the model's config.
    Returns:
        The query heads for a ``wq`` weight, the key/value heads for ``wk``, else 0 (no
        reordering).
    """
    if key.endswith(".attention.wq.weight"):
        return config.n_heads
    if key.endswith(".attention.wk.weight"):
        return config.n_kv_heads
    return 0


def rope_rows(heads: int, head_dim: int) -> torch.Tensor:
    """The row order that turns mx-nn's RoPE layout of q_proj/k_proj into Hugging Face's.

    Args:
        heads: heads of the projection.
        head_dim: features per head (even).
    Returns:
        int64 [heads * head_dim]: row ``r`` of the Hugging Face projection is row
        ``rope_rows(...)[r]`` of mx-nn's (per head: the even features, then the odd).
    """
    within = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    return (torch.arange(heads)[:, None] * head_dim + within).reshape(-1)


def hf_config(config: LlamaConfig) -> dict:
    """The Hugging Face ``LlamaConfig`` of the same model.

    Args:
        config: an mx-nn Llama config.
    Returns:
        The config as config.json holds it (a dict), dtype bfloat16: the dtype
        compressed-tensors decompresses MX weights to.
    """
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "intermediate_size": config.hidden_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        # transformers 5 reads rope_parameters; older releases (and engines pinned to
        # them) read rope_theta.
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_theta": config.rope_theta,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "dtype": "bfloat16",
    }


def mx_config(hf: dict) -> LlamaConfig:
    """The mx-nn config of a Hugging Face Llama config (inverse of :func:`hf_config`).

    Args:
        hf: a config.json's dict.
    Returns:
        The :class:`~mx_nn.models.llama.LlamaConfig`.
    Raises:
        ValueError: a config that is not a Llama this model can be (another model type,
            biases, tied embeddings, a RoPE scaling, a head_dim other than hidden_size /
            heads).
    """
    rope = hf.get("rope_parameters") or {}
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    unlike = {
        "model_type": (hf.get("model_type"), "llama"),
        "attention_bias": (hf.get("attention_bias", False), False),
        "mlp_bias": (hf.get("mlp_bias", False), False),
        "tie_word_embeddings": (hf.get("tie_word_embeddings", False), False),
        "hidden_act": (hf.get("hidden_act", "silu"), "silu"),
        "rope_type": (rope.get("rope_type", "default"), "default"),
    }
    heads, dim = hf.get("num_attention_heads"), hf.get("hidden_size")
    if heads and dim and hf.get("head_dim", dim // heads) != dim // heads:
        unlike["head_dim"] = (hf.get("head_dim"), dim // heads)
    wrong = {k: v for k, (v, want) in unlike.items() if v != want}
    if wrong:
        raise ValueError(f"config.json is not a Llama mx_nn.models.llama.Llama can be: {wrong}")
    return LlamaConfig(dim=dim, n_layers=hf["num_hidden_layers"], n_heads=heads,
                       n_kv_heads=hf.get("num_key_value_heads", heads),
                       vocab_size=hf["vocab_size"], hidden_dim=hf["intermediate_size"],
                       max_seq_len=hf["max_position_embeddings"], rope_theta=float(theta),
                       norm_eps=hf.get("rms_norm_eps", 1e-6))  # fmt: skip
