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
order, with mx-dtensor's MX styles where a linear is an MXLinear (as torchtitan's float8
plan swaps in its float8 styles) and PyTorch's for the rest (norms, the embedding, a
high-precision LM head, models left unconverted). Layouts of the residual stream with
sequence parallelism: ``Shard(1)`` (tokens split across ranks) between blocks,
``Replicate()`` inside attention and MLP, and the heads / hidden features split across
ranks inside (``use_local_output``: the model's own attention code sees plain local
tensors with ``n_heads / tp`` heads). The residual stream stays a DTensor so that code
reading its shape (position ids, masks) sees the whole sequence.
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

from mx_dtensor import MXColwiseParallel, MXRowwiseParallel, PrepareMXModuleInput
from mx_nn.linear import MXLinear

__all__ = [
    "ModelMap",
    "Naming",
    "NAMINGS",
    "block_plan",
    "find_model_map",
    "input_cast",
    "root_plan",
]


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


def input_cast(linear: nn.Module) -> dict | None:
    """The MX input cast of ``linear`` as keyword arguments of the MX styles (``fmt``,
    ``block_size``, ``scale_mode``, ``backend``), or None when it is not an MXLinear."""
    if not isinstance(linear, MXLinear):
        return None
    c = linear.config
    return {"fmt": c.input_fmt, "block_size": c.block_size, "scale_mode": c.scale_mode_name,
            "backend": c.cast_backend}  # fmt: skip


def _shared_cast(linears: list[nn.Module]) -> dict | None:
    """The input cast all ``linears`` make, or None if one is not MX or they differ (an
    MX gather must give each of them its own cast's values)."""
    casts = [input_cast(m) for m in linears]
    first = casts[0]
    same = first is not None and all(
        c is not None and {**c, "backend": None} == {**first, "backend": None} for c in casts
    )
    return first if same else None


def _colwise(linear: nn.Module, **layouts) -> ParallelStyle:
    cast = input_cast(linear)
    return ColwiseParallel(**layouts) if cast is None else MXColwiseParallel(**layouts, **cast)


def _rowwise(linear: nn.Module, **layouts) -> ParallelStyle:
    if not isinstance(linear, MXLinear):
        return RowwiseParallel(**layouts)
    return MXRowwiseParallel(**layouts, block_size=linear.config.block_size)


def _gather_input(
    block: nn.Module, path: str, kwarg: str | None, linears: tuple[str, ...], mx_comms: bool
) -> PrepareModuleInput:
    """Shard(1) -> Replicate for a module's hidden-state input, once for all its
    ``linears`` (in MX with ``mx_comms`` when they all make the same MX input cast)."""
    cast = _shared_cast([block.get_submodule(f"{path}.{p}") for p in linears])
    style, extra = (
        (PrepareMXModuleInput, cast) if mx_comms and cast is not None else (PrepareModuleInput, {})
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
    block: nn.Module, naming: Naming, *, sequence_parallel: bool, mx_comms: bool = False
) -> dict[str, ParallelStyle]:
    """The TP plan of one decoder block, keys relative to the block, in forward order.

    With sequence parallelism (torchtitan's plan; each style as PyTorch's, or its MX
    counterpart from :mod:`mx_dtensor` where the linear is an MXLinear)::

        attention_norm   SequenceParallel          Shard(1) -> Shard(1)
        attention        PrepareMXModuleInput      Shard(1) -> Replicate  (one all-gather)
        wq, wk, wv       MXColwiseParallel         Replicate -> Shard(-1) (local heads)
        wo               MXRowwiseParallel         Shard(-1) -> Shard(1)  (reduce-scatter)
        ffn_norm         SequenceParallel
        feed_forward     PrepareMXModuleInput      Shard(1) -> Replicate
        w1, w3           MXColwiseParallel
        w2               MXRowwiseParallel         -> Shard(1)

    The gathers are ``PrepareMXModuleInput`` (codes and scales move) with ``mx_comms``
    when the linears after them share one MX input cast, ``PrepareModuleInput``
    otherwise. The norms keep PyTorch's ``SequenceParallel``: the linears after the
    gather see the whole sequence. Without sequence parallelism the norms run
    replicated and the rowwise outputs are all-reduced to ``Replicate()``.
    """
    n, a, m = naming, naming.attention, naming.mlp

    def col(path: str) -> ParallelStyle:
        return _colwise(block.get_submodule(path))

    def row(path: str, **layouts) -> ParallelStyle:
        return _rowwise(block.get_submodule(path), **layouts)

    qkv = {f"{a}.{p}": col(f"{a}.{p}") for p in n.qkv}
    gate_up = {f"{m}.{p}": col(f"{m}.{p}") for p in n.gate_up}
    out, down = f"{a}.{n.out}", f"{m}.{n.down}"
    if not sequence_parallel:
        return {**qkv, out: row(out), **gate_up, down: row(down)}
    to_seq = {"output_layouts": Shard(1), "use_local_output": False}
    return {
        n.attention_norm: SequenceParallel(),
        a: _gather_input(block, a, n.attention_kwarg, n.qkv, mx_comms),
        **qkv,
        out: row(out, **to_seq),
        n.mlp_norm: SequenceParallel(),
        m: _gather_input(block, m, None, n.gate_up, mx_comms),
        **gate_up,
        down: row(down, **to_seq),
    }


def root_plan(
    model: nn.Module, model_map: ModelMap, *, sequence_parallel: bool, mx_comms: bool = False
) -> dict[str, ParallelStyle]:
    """TP plan of ``model``'s embedding, final norm and LM head (those it has).

    The embedding is split along the vocabulary (rowwise: each rank looks up its rows,
    partial sums reduced, with SP reduce-scattered to ``Shard(1)``); the head is
    columnwise along the vocabulary, its logits all-gathered to ``Replicate()`` (a plain
    tensor) for any loss. A high-precision head keeps ``ColwiseParallel``; an MX one
    (``mx_lm_head``) gets ``MXColwiseParallel``, whose gather of the sequence shard
    moves MX (``mx_comms``), except with sequence parallelism and no ``mx_comms``,
    where it keeps ``ColwiseParallel`` and its high-precision gather.
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
        head = model.get_submodule(model_map.head)
        layouts = {"input_layouts": seq, "output_layouts": Replicate(), "use_local_output": True}
        hp_gather = sequence_parallel and not mx_comms
        plan[model_map.head] = (
            ColwiseParallel(**layouts) if hp_gather else _colwise(head, **layouts)
        )
    return plan
