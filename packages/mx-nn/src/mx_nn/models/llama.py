"""A compact Llama-style decoder: RMSNorm, RoPE, SwiGLU, grouped-query attention.

Module names follow torchtitan's classic Llama, so a tensor-parallel plan keyed by these
paths maps it::

    tok_embeddings                       nn.Embedding  [vocab_size, dim]
    layers.<i>.attention_norm            nn.RMSNorm    [dim]
    layers.<i>.attention.wq              nn.Linear     [n_heads * head_dim, dim]
    layers.<i>.attention.wk, .wv         nn.Linear     [n_kv_heads * head_dim, dim]
    layers.<i>.attention.wo              nn.Linear     [dim, n_heads * head_dim]
    layers.<i>.ffn_norm                  nn.RMSNorm    [dim]
    layers.<i>.feed_forward.w1, .w3      nn.Linear     [hidden_dim, dim]
    layers.<i>.feed_forward.w2           nn.Linear     [dim, hidden_dim]
    norm                                 nn.RMSNorm    [dim]
    output                               nn.Linear     [vocab_size, dim]

No linear has a bias. Activations are [batch, seq, dim]; attention works on
[batch, heads, seq, head_dim].

Tensor parallelism shards wq/wk/wv (and w1/w3) along their output features, so each rank
holds ``n_heads / tp`` query heads and ``n_kv_heads / tp`` key/value heads. The attention
module reads its local head counts from the attributes :attr:`Attention.n_local_heads`
and :attr:`Attention.n_local_kv_heads`: a TP plan divides both by the TP degree (and
never ``head_dim``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Attention", "FeedForward", "Llama", "LlamaConfig", "TransformerBlock"]


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value <= 0:
        raise ValueError(f"{name}={value} must be positive")


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Shape of a :class:`Llama` (defaults: a small byte-level model)."""

    dim: int = 128
    """Model width (embedding and residual stream features)."""
    n_layers: int = 2
    """Number of transformer blocks."""
    n_heads: int = 4
    """Query heads; ``dim`` must be divisible by it (``head_dim = dim // n_heads``)."""
    n_kv_heads: int = 2
    """Key/value heads (grouped-query attention); divides ``n_heads``."""
    vocab_size: int = 256
    """Token vocabulary (256: bytes)."""
    hidden_dim: int = 384
    """SwiGLU hidden features (w1/w3 outputs, w2 input)."""
    max_seq_len: int = 256
    """Longest sequence the RoPE tables cover, in tokens."""
    rope_theta: float = 10000.0
    """RoPE base: position p rotates pair j by ``p * rope_theta ** (-2j / head_dim)`` rad."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim",
                     "max_seq_len"):  # fmt: skip
            _positive_int(name, getattr(self, name))
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} must be divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} (dim // n_heads) must be even for RoPE")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive number")

    @property
    def head_dim(self) -> int:
        """Features per attention head (``dim // n_heads``)."""
        return self.dim // self.n_heads


def rope_tables(head_dim: int, seq_len: int, theta: float) -> torch.Tensor:
    """cos and sin of the RoPE angles, fp32, shape [2, seq_len, head_dim // 2]."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return torch.stack([angles.cos(), angles.sin()]).float()


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive feature pairs of ``x`` [batch, seq, heads, head_dim] by the
    angles in ``rope`` [2, >= seq, head_dim // 2] (the complex-multiply form of RoPE)."""
    seq = x.shape[1]
    cos = rope[0, :seq, None, :]
    sin = rope[1, :seq, None, :]
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    out = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE (``F.scaled_dot_product_attention``).

    Attributes:
        n_local_heads: query heads this module computes (``n_heads``; a TP plan that
            shards wq/wo by heads divides it by the TP degree).
        n_local_kv_heads: key/value heads this module computes (``n_kv_heads``; divided
            the same way when wk/wv are sharded).
        head_dim: features per head (never sharded).
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_local_heads = config.n_heads
        self.n_local_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """``x`` [batch, seq, dim] -> [batch, seq, dim]; ``rope`` from :func:`rope_tables`."""
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, self.n_local_heads, self.head_dim)
        k = self.wk(x).view(bs, seq, self.n_local_kv_heads, self.head_dim)
        v = self.wv(x).view(bs, seq, self.n_local_kv_heads, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        n_rep = self.n_local_heads // self.n_local_kv_heads
        if n_rep > 1:
            k = k.repeat_interleave(n_rep, dim=2)
            v = v.repeat_interleave(n_rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, self.n_local_heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1(x)) * w3(x))``, [batch, seq, dim] -> [batch, seq, dim]."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.w2 = nn.Linear(config.hidden_dim, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, dim] -> [batch, seq, dim]."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``h = x + attention(attention_norm(x))``,
    ``out = h + feed_forward(ffn_norm(h))``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """[batch, seq, dim] -> [batch, seq, dim]."""
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Decoder-only transformer: token ids [batch, seq] (int64, seq <= max_seq_len) ->
    logits [batch, seq, vocab_size] in the dtype the output layer computes in.

    Weights are initialised by :meth:`init_weights` (called by the constructor; call it
    again under a fixed seed for a reproducible model). The RoPE tables are a
    non-persistent buffer, so the state_dict holds only the parameters.

    Example:
        >>> model = Llama(LlamaConfig(dim=64, n_layers=1, n_heads=2, n_kv_heads=1))
        >>> model(torch.zeros(2, 16, dtype=torch.long)).shape
        torch.Size([2, 16, 256])
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        rope = rope_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("rope", rope, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal(0, 0.02) embeddings and input projections; the projections that write
        into the residual stream (wo, w2) scaled by ``1 / sqrt(2 * n_layers)`` so the
        stream's variance does not grow with depth; output Normal(0, dim ** -0.5);
        norms at 1. Draws from the default generator in a fixed module order."""
        std = 0.02
        nn.init.normal_(self.tok_embeddings.weight, std=std)
        out_std = std / math.sqrt(2 * self.config.n_layers)
        for layer in self.layers:
            attn, ff = layer.attention, layer.feed_forward
            for lin in (attn.wq, attn.wk, attn.wv, ff.w1, ff.w3):
                nn.init.normal_(lin.weight, std=std)
            for lin in (attn.wo, ff.w2):
                nn.init.normal_(lin.weight, std=out_std)
            layer.attention_norm.reset_parameters()
            layer.ffn_norm.reset_parameters()
        self.norm.reset_parameters()
        nn.init.normal_(self.output.weight, std=self.config.dim**-0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids [batch, seq] -> logits [batch, seq, vocab_size]."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, seq], got shape {tuple(tokens.shape)}")
        if tokens.shape[1] > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {tokens.shape[1]} exceeds max_seq_len={self.config.max_seq_len}"
            )
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.rope)
        return self.output(self.norm(h))
