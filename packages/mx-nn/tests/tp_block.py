"""The Llama-style block (grouped-query attention, SwiGLU MLP, RMSNorm) and torchtitan's
tensor/sequence-parallel plan that the tensor-parallel tests run, with their helpers."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

RECIPES = ["mxfp8", "mxfp8_hp_wgrad", "mxfp8_e5m2_grads"]
PATHS = ["mx", "fake_quant"]
REL_TOL = 1e-5  # fp32 partial sums over K in another order (module doc)
DIM, HEADS, KV_HEADS, HIDDEN = 256, 8, 4, 512  # head_dim 32: k/v 128 wide, 32 per rank at tp=4
BATCH, SEQ = 2, 40  # 80 tokens: the columnwise casts pad M to 96 (locally, M unsharded)
SP_NORMS = ("attention_norm", "ffn_norm")  # the plan's SequenceParallel entries


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # -1: the heads of this rank (all of them on one process)
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def _plan() -> dict:
    """torchtitan's Llama plan: x between blocks is the sequence shard [B, S / tp, D]."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    def gather():  # Shard(1) (sequence) -> Replicate, before the colwise layers
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

    return {
        "attention_norm": SequenceParallel(),
        "attention": gather(),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": gather(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }


def _config(recipe: str, path: str):
    from mx_nn import MXLinearConfig

    return MXLinearConfig.from_recipe(recipe, compute_path=path)


def _blocks(config, mesh):
    """(reference MX block on this process, the same block parallelized over mesh)."""
    from torch.distributed.tensor.parallel import parallelize_module

    import mx_nn

    torch.manual_seed(0)
    block = Block()
    for norm in (block.attention_norm, block.ffn_norm):  # not all ones: the grads differ
        nn.init.normal_(norm.weight, 1.0, 0.1)
    ref = mx_nn.convert(copy.deepcopy(block), config) if config else copy.deepcopy(block)
    tp = mx_nn.convert(copy.deepcopy(block), config) if config else copy.deepcopy(block)
    return ref, parallelize_module(tp, mesh, _plan())


def one_rank_results(mesh, config, device, sp_norms: bool, compiled: bool) -> dict:
    """The bf16 block on plain tensors and parallelized over the one-rank ``mesh`` (the
    plan without its SequenceParallel norms unless ``sp_norms``; each compiled with
    fullgraph if ``compiled``), forward + backward on the same input and output grad:
    {result name: (plain, parallelized as a full tensor)} for the output, the input's
    gradient and every parameter's. ``config`` None: the nn.Linear block."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    import mx_nn

    def full(t):  # parameters the plan leaves out (the norms, without SP) stay plain
        return t.full_tensor() if isinstance(t, DTensor) else t

    torch.manual_seed(0)
    block = Block().to(device=device, dtype=torch.bfloat16)
    plain = mx_nn.convert(copy.deepcopy(block), config) if config else copy.deepcopy(block)
    tp = mx_nn.convert(copy.deepcopy(block), config) if config else copy.deepcopy(block)
    plan = {k: v for k, v in _plan().items() if sp_norms or k not in SP_NORMS}
    tp = parallelize_module(tp, mesh, plan)
    params, tp_params = dict(plain.named_parameters()), dict(tp.named_parameters())
    if compiled:
        plain, tp = torch.compile(plain, fullgraph=True), torch.compile(tp, fullgraph=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, DIM, generator=g).to(device=device, dtype=torch.bfloat16)
    grad = torch.randn(2, 64, DIM, generator=g).to(device=device, dtype=torch.bfloat16)
    results = []
    for module in (plain, tp):
        xx = x.clone().requires_grad_()
        y = module(xx)
        y.backward(grad)
        results.append((full(y), xx.grad))
    (y0, g0), (y1, g1) = results
    named = {"out": (y0, y1), "grad_input": (g0, full(g1))}
    return named | {n: (params[n].grad, full(p.grad)) for n, p in tp_params.items()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
