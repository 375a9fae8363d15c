"""Find a Llama-style model's decoder blocks and build its tensor-parallel plan.

Two namings are mapped by structure (every path below must resolve, the linears to
``nn.Linear`` subclasses):

==================  ===============================  ==============================
role                Hugging Face transformers        torchtitan (classic)
==================  ===============================  ==============================
pre-attention norm  ``input_layernorm``              ``attention_norm``
attention           ``self_attn.{q,k,v,o}_proj``     ``attention.{wq,wk,wv,wo}``
pre-MLP norm        ``post_attention_layernorm``     ``ffn_norm``
MLP                 ``mlp.{gate,up,down}_proj``      ``feed_forward.{w1,w3,w2}``
embedding           ``embed_tokens``                 ``tok_embeddings``
final norm, head    ``norm``, ``lm_head``            ``norm``, ``output``
==================  ===============================  ==============================

The plan is torchtitan's Llama plan, written as one flat dict per block in forward
order. Layouts of the residual stream with sequence parallelism: ``Shard(1)`` (tokens
split across ranks) between blocks, ``Replicate()`` inside attention and MLP, and the
heads / hidden features split across ranks inside (``use_local_output``: the model's
own attention code sees plain local tensors with ``n_heads / tp`` heads). The residual
stream stays a DTensor so that code reading its shape (position ids, masks) sees the
whole sequence.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from mx_dtensor.styles import PrepareMXModuleInput

__all__ = ["ModelMap", "Naming", "NAMINGS", "block_plan", "find_model_map", "root_plan"]


@dataclass(frozen=True, kw_only=True)
class Naming:
    """Module paths of one Llama naming (relative to a decoder block, or the model)."""

    name: str
    """Human name of the naming, used in messages."""
    attention: str
    """Attention module (its input is gathered once for q, k and v)."""
    qkv: tuple[str, str, str]
    """q, k, v projections (columnwise)."""
    out: str
    """Attention output projection (rowwise)."""
    mlp: str
    """MLP module (its input is gathered once for gate and up)."""
    gate_up: tuple[str, str]
    """Gate and up projections (columnwise)."""
    down: str
    """Down projection (rowwise)."""
    attention_norm: str
    """Norm before attention."""
    mlp_norm: str
    """Norm before the MLP."""
    embedding: str
    """Token embedding (last path component, searched outside the blocks)."""
    norm: str
    """Final norm (last path component, outside the blocks)."""
    head: str
    """LM head linear (last path component, outside the blocks)."""
    attention_kwarg: str | None
    """Keyword the block passes the attention input by, or None when positional."""

    @property
    def linears(self) -> tuple[str, ...]:
        """The seven linears of a block, in forward order."""
        a, m = self.attention, self.mlp
        return (
            *(f"{a}.{p}" for p in self.qkv),
            f"{a}.{self.out}",
            *(f"{m}.{p}" for p in self.gate_up),
            f"{m}.{self.down}",
        )


NAMINGS: tuple[Naming, ...] = (
    Naming(
        name="Hugging Face Llama",
        attention="self_attn",
        qkv=("q_proj", "k_proj", "v_proj"),
        out="o_proj",
        mlp="mlp",
        gate_up=("gate_proj", "up_proj"),
        down="down_proj",
        attention_norm="input_layernorm",
        mlp_norm="post_attention_layernorm",
        embedding="embed_tokens",
        norm="norm",
        head="lm_head",
        attention_kwarg="hidden_states",
    ),
    Naming(
        name="torchtitan Llama",
        attention="attention",
        qkv=("wq", "wk", "wv"),
        out="wo",
        mlp="feed_forward",
        gate_up=("w1", "w3"),
        down="w2",
        attention_norm="attention_norm",
        mlp_norm="ffn_norm",
        embedding="tok_embeddings",
        norm="norm",
        head="output",
        attention_kwarg=None,
    ),
)


@dataclass(frozen=True)
class ModelMap:
    """Where a model's parts are: block fqns in order and the root modules (or None)."""

    naming: Naming
    blocks: tuple[str, ...]
    embedding: str | None
    norm: str | None
    head: str | None


def _get(module: nn.Module, path: str) -> nn.Module | None:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def _is_block(module: nn.Module, naming: Naming) -> bool:
    if any(not isinstance(_get(module, p), nn.Linear) for p in naming.linears):
        return False
    return all(_get(module, p) is not None for p in (naming.attention_norm, naming.mlp_norm))


def find_model_map(model: nn.Module) -> ModelMap | None:
    """The first naming whose decoder blocks occur in ``model``, or None.

    Blocks are found by structure wherever they are; the embedding, final norm and head
    are the modules outside every block whose last path component is the naming's name.
    """
    for naming in NAMINGS:
        blocks = [fqn for fqn, m in model.named_modules() if fqn and _is_block(m, naming)]
        if not blocks:
            continue
        inside = tuple(f"{b}." for b in blocks)

        def outside(leaf: str, kind: type, inside=inside) -> str | None:
            for fqn, m in model.named_modules():
                if fqn.rsplit(".", 1)[-1] == leaf and not fqn.startswith(inside):
                    if isinstance(m, kind):
                        return fqn
            return None

        return ModelMap(
            naming=naming,
            blocks=tuple(blocks),
            embedding=outside(naming.embedding, nn.Embedding),
            norm=outside(naming.norm, nn.Module),
            head=outside(naming.head, nn.Linear),
        )
    return None


def _required_positional(module: nn.Module) -> int:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = inspect.signature(module.forward).parameters.values()
    return sum(p.kind in kinds and p.default is inspect.Parameter.empty for p in params)


def _gather_input(
    block: nn.Module, path: str, kwarg: str | None, mx_gather: dict | None
) -> PrepareModuleInput:
    """Shard(1) -> Replicate for a module's hidden-state input, once for all its linears
    (in MX when ``mx_gather`` holds the cast's fmt, block_size and scale_mode)."""
    style, extra = (
        (PrepareModuleInput, {}) if mx_gather is None else (PrepareMXModuleInput, mx_gather)
    )
    if kwarg is not None:
        return style(
            input_kwarg_layouts={kwarg: Shard(1)},
            desired_input_kwarg_layouts={kwarg: Replicate()},
            **extra,
        )
    rest = (None,) * (max(_required_positional(block.get_submodule(path)), 1) - 1)
    return style(
        input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest), **extra
    )


def block_plan(
    block: nn.Module, naming: Naming, *, sequence_parallel: bool, mx_gather: dict | None = None
) -> dict[str, ParallelStyle]:
    """The TP plan of one decoder block, keys relative to the block, in forward order.

    With sequence parallelism (torchtitan's plan)::

        attention_norm   SequenceParallel         Shard(1) -> Shard(1)
        attention        PrepareModuleInput       Shard(1) -> Replicate  (one all-gather)
        wq, wk, wv       ColwiseParallel          Replicate -> Shard(-1) (local heads)
        wo               RowwiseParallel          Shard(-1) -> Shard(1)  (reduce-scatter)
        ffn_norm         SequenceParallel
        feed_forward     PrepareModuleInput       Shard(1) -> Replicate
        w1, w3           ColwiseParallel
        w2               RowwiseParallel          -> Shard(1)

    Without it the norms run replicated and the rowwise outputs are all-reduced to
    ``Replicate()``. With ``mx_gather`` (keyword arguments of ``PrepareMXModuleInput``)
    the two gathers move MX codes and scales instead (``mx_dtensor.styles``).
    """
    n, a, m = naming, naming.attention, naming.mlp
    col, row = ColwiseParallel, RowwiseParallel
    if not sequence_parallel:
        return {
            **{f"{a}.{p}": col() for p in n.qkv},
            f"{a}.{n.out}": row(),
            **{f"{m}.{p}": col() for p in n.gate_up},
            f"{m}.{n.down}": row(),
        }
    return {
        n.attention_norm: SequenceParallel(),
        a: _gather_input(block, a, n.attention_kwarg, mx_gather),
        **{f"{a}.{p}": col() for p in n.qkv},
        f"{a}.{n.out}": row(output_layouts=Shard(1), use_local_output=False),
        n.mlp_norm: SequenceParallel(),
        m: _gather_input(block, m, None, mx_gather),
        **{f"{m}.{p}": col() for p in n.gate_up},
        f"{m}.{n.down}": row(output_layouts=Shard(1), use_local_output=False),
    }


def root_plan(model_map: ModelMap, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """TP plan of the embedding, final norm and LM head (those the model has).

    The embedding is split along the vocabulary (rowwise: each rank looks up its rows,
    partial sums reduced, with SP reduce-scattered to ``Shard(1)``); the head is
    columnwise along the vocabulary, its logits all-gathered to ``Replicate()`` (a plain
    tensor) for any loss.
    """
    plan: dict[str, ParallelStyle] = {}
    seq = Shard(1) if sequence_parallel else Replicate()
    if model_map.embedding is not None:
        plan[model_map.embedding] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=seq, use_local_output=not sequence_parallel
        )
    if sequence_parallel and model_map.norm is not None:
        plan[model_map.norm] = SequenceParallel()
    if model_map.head is not None:
        plan[model_map.head] = ColwiseParallel(
            input_layouts=seq, output_layouts=Replicate(), use_local_output=True
        )
    return plan
