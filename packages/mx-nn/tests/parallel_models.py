"""Small Llama-style models and multi-rank helpers for the parallelize tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DIM, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 256, 8, 4, 512, 256, 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    # x [B, S, H, D], angles [S, D/2]: rotate (even, odd) pairs.
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    """torchtitan's classic attention: reads its (local) head counts from attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = HEADS, KV_HEADS, DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = _rope(self.wq(x).view(b, s, self.n_heads, self.head_dim), angles)
        k = _rope(self.wk(x).view(b, s, self.n_kv_heads, self.head_dim), angles)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), angles)
        return h + self.feed_forward(self.ffn_norm(h))


class TitanLlama(nn.Module):
    """torchtitan's classic Llama naming: tok_embeddings, layers.<i>.*, norm, output."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        hd = DIM // HEADS
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        self.register_buffer(
            "angles", torch.outer(torch.arange(256).float(), inv), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        angles = self.angles[: tokens.shape[1]]
        for layer in self.layers:
            h = layer(h, angles)
        return self.output(self.norm(h))


def titan_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TitanLlama()


def hf_model(seed: int = 0) -> nn.Module:
    """A tiny random transformers LlamaForCausalLM with grouped-query attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=DIM // HEADS,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        attention_bias=True,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def project_model(seed: int = 0) -> nn.Module:
    """The project's own mx_nn.models.Llama at the tests' shape."""
    import mx_nn

    torch.manual_seed(seed)
    config = mx_nn.models.LlamaConfig(dim=DIM, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=KV_HEADS,
                               vocab_size=VOCAB, hidden_dim=FFN)  # fmt: skip
    return mx_nn.models.Llama(config)


def logits_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    out = model(tokens)
    return out if isinstance(out, torch.Tensor) else out.logits


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = logits_of(model, tokens)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of a DTensor (gathered) or of a plain tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = full(a).detach().double(), full(b).detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class TitanEmbedRenamed(TitanLlama):
    """A torchtitan-named model whose embedding parallelize cannot recognise."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = self.tok_embeddings
        del self.tok_embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, self.angles[: tokens.shape[1]])
        return self.output(self.norm(h))
