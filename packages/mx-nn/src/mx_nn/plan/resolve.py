"""Resolve the literal plan (:mod:`mx_nn.plan.llama`) for one model: the family's
module names, and per module the MX or the plain style.

- ``ColwiseParallel`` / ``RowwiseParallel`` on an MXLinear become mx-dtensor's
  ``MXColwiseParallel`` (its input cast's settings) / ``MXRowwiseParallel``, with the
  same layouts; on anything else they stay PyTorch's.
- A ``PrepareModuleInput`` gather becomes ``PrepareMXModuleInput`` (codes and scales
  move) with ``mx_comms`` when every linear it feeds makes the same MX input cast, and
  its layouts are fitted to how the family calls the module.
- torchtitan 0.3's embedding, which looks up its own vocabulary shard, gets
  :class:`~mx_nn.plan.titan.VocabParallelEmbedding` (the same split and output layouts).
- An MX LM head gathers in MX only with ``mx_comms``; with sequence parallelism and no
  ``mx_comms`` it keeps PyTorch's style and its high-precision gather.
- The parts of a :class:`~mx_nn.plan.fused.SplitLinear` (Phi-3's split ``qkv_proj``)
  are linears like any other; the SplitLinear itself gets
  :class:`~mx_nn.plan.fused.SplitLinearParallel` (the TP degree, its attention's
  per-rank head counts).
- A norm of :data:`~mx_nn.plan.llama.HEAD_NORMS` as wide as its projection's output
  (OLMo2's ``q_norm``) gets :class:`~mx_nn.plan.norms.HeadShardedNorm`; one per head
  (``[head_dim]``) none: each rank holds whole heads.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
)

from mx_core import CastSettings
from mx_dtensor import MXColwiseParallel, MXRowwiseParallel, PrepareMXModuleInput
from mx_nn.linear import MXLinear
from mx_nn.plan.families import ModelMap
from mx_nn.plan.fused import SplitLinear, SplitLinearParallel
from mx_nn.plan.llama import HEAD_NORMS, block_plan, root_plan
from mx_nn.plan.norms import across_heads
from mx_nn.plan.titan import VocabParallelEmbedding, is_vocab_parallel_embedding

__all__ = ["input_cast", "model_plan"]


def input_cast(linear: nn.Module) -> CastSettings | None:
    """The MX input cast of a linear.

    Args:
        linear: any module.
    Returns:
        The :class:`~mx_core.CastSettings` of an MXLinear's input cast (format, block
        size, scale mode, backend), or None when ``linear`` is not an MXLinear.
    """
    if not isinstance(linear, MXLinear):
        return None
    c = linear.config
    return CastSettings(fmt=c.input_fmt, block_size=c.block_size, scale_mode=c.scale_mode_name,
                        backend=c.cast_backend)  # fmt: skip


def _layouts(style: ColwiseParallel | RowwiseParallel) -> dict:
    return {"input_layouts": style.input_layouts[0], "output_layouts": style.output_layouts[0],
            "use_local_output": style.use_local_output}  # fmt: skip


def _linear_style(style: ParallelStyle, module: nn.Module) -> ParallelStyle:
    if not isinstance(module, MXLinear):
        return style
    if type(style) is ColwiseParallel:
        return MXColwiseParallel(**_layouts(style), cast=input_cast(module))
    if type(style) is RowwiseParallel:
        return MXRowwiseParallel(**_layouts(style), block_size=module.config.block_size)
    return style


def _shared_cast(linears: list[nn.Module]) -> CastSettings | None:
    """The input cast all ``linears`` make, or None if one is not MX or they differ (an MX
    gather must give each of them its own cast's values; backends may differ)."""
    casts = [input_cast(m) for m in linears]
    first = casts[0] if casts else None
    same = first is not None and all(c is not None and c.same_values(first) for c in casts)
    return first if same else None


def _gather(style: PrepareModuleInput, arg: str | int, cast: CastSettings | None):
    """``style``'s hidden-state layouts, for a module called with the hidden states as
    keyword ``arg`` or as the first of ``arg`` positional arguments."""
    src, dst = style.input_layouts[0], style.desired_input_layouts[0]
    kind, extra = (
        (PrepareModuleInput, {}) if cast is None else (PrepareMXModuleInput, {"cast": cast})
    )
    if isinstance(arg, str):
        return kind(input_kwarg_layouts={arg: src}, desired_input_kwarg_layouts={arg: dst},
                    **extra)  # fmt: skip
    rest = (None,) * (arg - 1)
    return kind(input_layouts=(src, *rest), desired_input_layouts=(dst, *rest), **extra)


def model_plan(
    model: nn.Module, model_map: ModelMap, *, sequence_parallel: bool, mx_comms: bool
) -> dict[str, ParallelStyle]:
    """The whole TP plan of ``model``: the literal plan resolved (module doc).

    Args:
        model: the model, its MXLinears already in place.
        model_map: where its blocks and root modules are
            (:func:`~mx_nn.plan.families.find_model_map`).
        sequence_parallel: as :func:`~mx_nn.plan.llama.block_plan`.
        mx_comms: gather in MX (codes and scales) where every linear fed makes the same
            input cast, and the MX LM head's input too (module doc).
    Returns:
        fqn -> style, blocks in order then the root; modules the family lacks left out.
    """
    family = model_map.family
    plan: dict[str, ParallelStyle] = {}
    for b in model_map.blocks:
        block = model.get_submodule(b)
        for key, style in block_plan(sequence_parallel=sequence_parallel).items():
            path = family.path(key)
            if path is None:
                continue
            module = block.get_submodule(path)  # there: find_model_map checked every path
            if key in HEAD_NORMS:
                projection = block.get_submodule(family.path(HEAD_NORMS[key]))
                if not across_heads(module, projection):
                    continue  # one norm per head: each rank's heads are whole
            elif isinstance(style, PrepareModuleInput):
                fed = [block.get_submodule(p) for p in family.linears() if p.startswith(f"{path}.")]
                cast = _shared_cast(fed) if mx_comms else None
                arg = family.attention_input if key == "attention" else 1
                style = _gather(style, arg, cast)
            else:
                style = _linear_style(style, module)
                parent = path.rpartition(".")[0]
                if isinstance(block.get_submodule(parent), SplitLinear):
                    plan.setdefault(f"{b}.{parent}", SplitLinearParallel())
            plan[f"{b}.{path}"] = style
    fqns = {"tok_embeddings": model_map.embedding, "norm": model_map.norm,
            "lm_head": model_map.head}  # fmt: skip
    for key, style in root_plan(sequence_parallel=sequence_parallel).items():
        fqn = fqns[key]
        if fqn is None:
            continue
        module = model.get_submodule(fqn)
        if key == "lm_head" and not (sequence_parallel and not mx_comms):
            style = _linear_style(style, module)
        if key == "tok_embeddings" and is_vocab_parallel_embedding(module):
            style = VocabParallelEmbedding.like(style)
        plan[fqn] = style
    return plan
