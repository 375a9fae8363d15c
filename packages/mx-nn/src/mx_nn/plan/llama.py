"""The tensor-parallel plan of a Llama-style decoder, as literal dicts in torchtitan 0.3's
module names, in forward order.

These are PyTorch's styles, as a reader of torchtitan knows them; where a linear is an
MXLinear, :mod:`mx_nn.plan.resolve` swaps in mx-dtensor's MX counterpart (and the
family's module names, :mod:`mx_nn.plan.families`). Layouts of the residual stream with
sequence parallelism: ``Shard(1)`` (tokens split across ranks) between blocks and around
the norms, ``Replicate()`` at the input of attention and the MLP (one all-gather each),
heads / hidden features split across ranks inside them (``Shard(-1)``, plain local
tensors: the model's own attention code sees ``n_heads / tp`` heads), and a
reduce-scatter back to ``Shard(1)`` after the output projections. Without sequence
parallelism the norms run replicated and the output projections all-reduce.

Keys marked optional are planned only where the family has that module (Gemma2/3 and
OLMo2 normalise the attention and MLP outputs too; OLMo2 normalises the whole query and
key projections, across heads: :class:`~mx_nn.plan.norms.HeadShardedNorm`).
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from mx_nn.plan.norms import HeadShardedNorm

__all__ = ["HEAD_NORMS", "OPTIONAL", "block_plan", "root_plan"]

HEAD_NORMS: dict[str, str] = {
    "attention.q_norm": "attention.qkv_linear.wq",
    "attention.k_norm": "attention.qkv_linear.wk",
}
"""Norms over all heads of a projection's output (norm key -> the projection's key)."""

OPTIONAL: frozenset[str] = frozenset(
    {"attention_norm", "post_attention_norm", "ffn_norm", "post_ffn_norm", *HEAD_NORMS}
)
"""Block keys a family may not have (the resolver drops them where it has none)."""


def block_plan(*, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """One decoder block's plan, keys relative to the block (torchtitan 0.3 names).

    ``attention``'s input layouts are written for its hidden-state argument alone; the
    resolver fits them to how the family calls attention (more positional arguments, or
    the ``hidden_states`` keyword).

    Args:
        sequence_parallel: the residual stream ``Shard(1)`` between blocks (norms
            sequence-parallel, gathers before attention and the MLP, reduce-scatters
            after); otherwise replicated, the output projections all-reducing.
    Returns:
        Block key -> a fresh PyTorch style, in forward order (optional keys included:
        :data:`OPTIONAL`).
    """
    if not sequence_parallel:
        return {
            "attention.qkv_linear.wq": ColwiseParallel(),  # Replicate -> Shard(-1)
            "attention.qkv_linear.wk": ColwiseParallel(),
            "attention.qkv_linear.wv": ColwiseParallel(),
            "attention.q_norm": HeadShardedNorm(),  # optional: Shard(-1) -> Shard(-1)
            "attention.k_norm": HeadShardedNorm(),  # optional
            "attention.wo": RowwiseParallel(),  # Shard(-1) -> Replicate (all-reduce)
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        }
    return {
        "attention_norm": SequenceParallel(),  # Shard(1) -> Shard(1)
        "attention": PrepareModuleInput(  # Shard(1) -> Replicate (all-gather)
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "attention.qkv_linear.wq": ColwiseParallel(),  # Replicate -> Shard(-1), local heads
        "attention.qkv_linear.wk": ColwiseParallel(),
        "attention.qkv_linear.wv": ColwiseParallel(),
        "attention.q_norm": HeadShardedNorm(),  # optional: Shard(-1) -> Shard(-1), all heads
        "attention.k_norm": HeadShardedNorm(),  # optional
        "attention.wo": RowwiseParallel(  # Shard(-1) -> Shard(1) (reduce-scatter)
            output_layouts=Shard(1), use_local_output=False
        ),
        "post_attention_norm": SequenceParallel(),  # optional: Shard(1) -> Shard(1)
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(  # Shard(1) -> Replicate (all-gather)
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),  # Replicate -> Shard(-1)
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(  # Shard(-1) -> Shard(1) (reduce-scatter)
            output_layouts=Shard(1), use_local_output=False
        ),
        "post_ffn_norm": SequenceParallel(),  # optional
    }


def root_plan(*, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The plan outside the blocks (torchtitan 0.3 names): the embedding split along the
    vocabulary (each rank looks up its rows; partial sums reduced, with sequence
    parallelism reduce-scattered to ``Shard(1)``), the final norm sequence-parallel,
    the LM head columnwise along the vocabulary with its logits all-gathered to a plain
    ``Replicate()`` tensor for any loss.

    Args:
        sequence_parallel: as :func:`block_plan`.
    Returns:
        Root key (``tok_embeddings``, ``norm`` with sequence parallelism, ``lm_head``) ->
        a fresh PyTorch style.
    """
    if not sequence_parallel:
        return {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),  # -> Replicate
            "lm_head": ColwiseParallel(output_layouts=Replicate()),  # Replicate -> Replicate
        }
    return {
        "tok_embeddings": RowwiseParallel(  # Replicate -> Shard(1) (reduce-scatter)
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        ),
        "norm": SequenceParallel(),  # Shard(1) -> Shard(1)
        "lm_head": ColwiseParallel(  # Shard(1) -> all-gather -> Replicate logits
            input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True
        ),
    }
