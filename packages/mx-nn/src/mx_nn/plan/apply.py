"""The steps ``parallelize`` composes, public for trainers that run them one by one:
:func:`apply_tp`, :func:`apply_compile`, :func:`apply_fsdp` (in that order, after
``mx_nn.convert``)."""

from __future__ import annotations

import logging

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

import mx_dtensor  # noqa: F401  (registers the mx ops' DTensor sharding rules)
from mx_dtensor import PrepareMXModuleInput
from mx_nn.casts.gathered import enable_gather_handover
from mx_nn.casts.scopes import add_cast_scope
from mx_nn.fsdp.enable import enable_fsdp_mx_all_gather
from mx_nn.linear import MXLinear
from mx_nn.plan.checks import (
    check_flags,
    check_plan_modules,
    check_ties,
    check_tp_sizes,
    expand_plan,
)
from mx_nn.plan.families import ModelMap, find_model_map, unmapped_message
from mx_nn.plan.resolve import model_plan

__all__ = ["apply_compile", "apply_fsdp", "apply_tp"]

logger = logging.getLogger("mx_nn")

# Attributes an attention module may read its head counts from; each one present is
# divided by the TP degree so the model's own attention code sees its local heads.
# (Hugging Face's attention infers them from the tensor shapes: it has none.)
_HEAD_ATTRS = (
    "n_heads",
    "n_kv_heads",
    "num_heads",
    "num_key_value_heads",
    "n_local_heads",
    "n_local_kv_heads",
)


def _blocks(model: nn.Module) -> list[nn.Module]:
    model_map = find_model_map(model)
    return [model.get_submodule(b) for b in model_map.blocks] if model_map else []


def apply_tp(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    *,
    plan: dict[str, ParallelStyle] | None = None,
    sequence_parallel: bool = True,
    mx_comms: bool = True,
    include_single_rank: bool = False,
) -> nn.Module:
    """Tensor (and sequence) parallelism over the 1-D ``tp_mesh``, in place.

    The built-in plan (:mod:`mx_nn.plan.llama`, resolved per module by
    :mod:`mx_nn.plan.resolve`) unless ``plan`` is given; each module whose input an MX
    gather prepares gets a cast scope, so the gather hands its cast to the linears.
    Run it after ``mx_nn.convert`` (the styles follow the module types).

    Args:
        model: a model of a family :mod:`mx_nn.plan.families` knows, or any model with
            ``plan``.
        tp_mesh: a 1-D device mesh; at size 1 nothing is applied (logged) unless
            ``include_single_rank``.
        plan: fqn pattern (``*``: one path component) -> ParallelStyle, used as given.
        sequence_parallel: shard the norms and the residual stream along dim 1 (needs
            the embedding and final norm; without them plain TP runs, logged).
        mx_comms: MX gathers where the linears after them share one MX input cast.
        include_single_rank: apply the plan at size 1 too: DTensor parameters and
            activations on one rank, with no communication that moves data. What
            benchmarks measure the DTensor path's host cost with (``parallelize`` leaves
            it out: at tp=1 DTensors only add host time per op).

    Returns:
        ``model``.

    Raises:
        ValueError: an unmapped model without ``plan``, a plan key matching nothing,
            sizes ``tp`` does not divide, or a tie it cannot keep (at tp=1 too with
            ``include_single_rank``; all before any change).
        TypeError: a plan style on a module it cannot shard; ``include_single_rank`` not
            a bool.
    """
    check_flags(include_single_rank=include_single_rank)
    tp = tp_mesh.size()
    model_map = None if plan is not None else find_model_map(model)
    if plan is None and model_map is None:
        raise ValueError(unmapped_message(model))
    explicit = expand_plan(model, plan) if plan is not None else None
    keep_tie = check_ties(model, tp, model_map, explicit is not None)
    if tp == 1 and include_single_rank:
        _check_single_rank_ties(model, model_map if keep_tie else None)
    if tp == 1 and not include_single_rank:
        # A plan over one rank is the identity; DTensors would only add host time per op
        # (torchtitan leaves a degree-1 TP out as well).
        logger.info("mx_nn.apply_tp: tp=1, tensor parallelism left out (plain tensors)")
        return model
    if explicit is not None:
        check_plan_modules(model, explicit, tp_mesh)
        _apply_plan(model, tp_mesh, explicit)
        logger.info("mx_nn.apply_tp: explicit plan, %d modules, tp=%d", len(explicit), tp)
        return model
    mx = {f: m.config.block_size for f, m in model.named_modules() if isinstance(m, MXLinear)}
    check_tp_sizes(model, model_map, tp, mx)
    sp = sequence_parallel and _sequence_parallel_applies(model_map)
    _apply_plan(model, tp_mesh, model_plan(model, model_map, sequence_parallel=sp,
                                           mx_comms=mx_comms))  # fmt: skip
    if keep_tie:  # both Shard(0) on tp_mesh, from the same tensor: one DTensor serves both
        model.get_submodule(model_map.head).weight = model.get_submodule(model_map.embedding).weight
    # The head counts change last: the forward reads them, the plan does not.
    for b in model_map.blocks:
        attn = model.get_submodule(f"{b}.{model_map.family.path('attention')}")
        for attr in _HEAD_ATTRS:
            value = getattr(attn, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(attn, attr, value // tp)
    if sp:
        emb = model.get_submodule(model_map.embedding)
        emb.register_forward_pre_hook(_sequence_check(model_map.embedding, tp))
    logger.info(
        "mx_nn.apply_tp: %s plan on %d blocks, tp=%d, sequence_parallel=%s%s",
        model_map.family.name, len(model_map.blocks), tp, sp,
        ", LM head tied to the embedding" if keep_tie else "",
    )  # fmt: skip
    return model


def apply_compile(model: nn.Module) -> nn.Module:
    """``torch.compile`` each decoder block in place (fqns unchanged): after tensor
    parallelism, so the graphs trace the DTensor code, and before FSDP2, so its per-block
    all-gather hooks stay outside the graphs.

    Args:
        model: a model of a family :mod:`mx_nn.plan.families` knows.

    Returns:
        ``model``.

    Raises:
        ValueError: no decoder block found.
    """
    blocks = _blocks(model)
    if not blocks:
        raise ValueError(
            f"apply_compile compiles each decoder block, but {type(model).__name__} has none "
            f"mx_nn can find; torch.compile the model instead"
        )
    for block in blocks:
        block.compile()
    return model


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, *, mx_all_gather: bool = False) -> nn.Module:
    """FSDP2 over the 1-D ``dp_mesh``: ``fully_shard`` of each decoder block, then the root.

    With ``mx_all_gather`` the blocks' MXLinear weights are gathered as MX casts
    (:mod:`mx_nn.fsdp.weight`) and the blocks reshard after forward (backward gathers
    again, the columnwise cast). ``parallelize`` checks what that needs
    (:func:`mx_nn.fsdp.check.check_fsdp_mx`) before it changes anything.

    Args:
        model: the model, after :func:`apply_tp` and :func:`apply_compile` where they run.
        dp_mesh: a 1-D device mesh.
        mx_all_gather: gather the blocks' MXLinear weights as MX casts.

    Returns:
        ``model``.
    """
    blocks = _blocks(model)
    if mx_all_gather:
        n = sum(enable_fsdp_mx_all_gather(block) for block in blocks)
        rest = sum(isinstance(m, MXLinear) for m in model.modules()) - n
        logger.info(
            "mx_nn.apply_fsdp: FSDP2 gathers the %d MXLinear weights of the blocks in MX, "
            "%d MXLinear weights outside them in high precision", n, rest,
        )  # fmt: skip
    reshard = {"reshard_after_forward": True} if mx_all_gather else {}
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, **reshard)
    fully_shard(model, mesh=dp_mesh)
    logger.info("mx_nn.apply_fsdp: fully_shard of %d blocks and the root, dp=%d", len(blocks),
                dp_mesh.size())  # fmt: skip
    return model


def _sequence_parallel_applies(model_map: ModelMap) -> bool:
    if model_map.embedding is not None and model_map.norm is not None:
        return True
    missing = "embedding" if model_map.embedding is None else "final norm"
    logger.info(
        "mx_nn.apply_tp: sequence parallelism not applied (no %s found to enter/leave the "
        "sequence-sharded region)", missing,
    )  # fmt: skip
    return False


def _apply_plan(model: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, ParallelStyle]) -> None:
    """``parallelize_module`` with ``plan`` (keys: module paths), then a cast scope on each
    module whose input an MX gather prepares: the gather hands its cast to the linears
    called inside through that scope (:mod:`mx_nn.casts.gathered`)."""
    parallelize_module(model, tp_mesh, plan)
    if any(isinstance(style, PrepareMXModuleInput) for style in plan.values()):
        enable_gather_handover()
    for fqn, style in plan.items():
        if isinstance(style, PrepareMXModuleInput):
            add_cast_scope(model.get_submodule(fqn))


def _check_single_rank_ties(model: nn.Module, kept: ModelMap | None) -> None:
    """What ``check_ties`` refuses where tp > 1, for a plan applied at tp=1: the styles
    make DTensors on one rank too, so they would untie every tie but the head's to the
    embedding (kept where ``kept`` is the model's map)."""
    keep = {f"{kept.embedding}.weight", f"{kept.head}.weight"} if kept else set()
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    for group in names.values():
        if len(group) > 1 and set(group) != keep:
            raise ValueError(
                f"apply_tp(include_single_rank=True): model ties "
                f"{' and '.join(map(repr, group))} (one Parameter), but the plan shards each "
                f"module's parameters into a DTensor of its own, which would untie them; "
                f"untie them first or leave include_single_rank off"
            )


def _sequence_check(fqn: str, tp: int):
    def hook(_module, args):
        tokens = args[0]
        seq = tokens.shape[1] if tokens.ndim >= 2 else None
        if seq is None or seq % tp:
            pad = -seq % tp if seq is not None else tp
            raise ValueError(
                f"sequence parallelism splits the input of {fqn} along dim 1 into tp={tp} "
                f"shards: got input shape {tuple(tokens.shape)}; pad the sequence by {pad} "
                f"tokens to a multiple of {tp}"
            )

    return hook
