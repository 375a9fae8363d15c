"""``parallelize(model, mesh)``: MX conversion, tensor/sequence parallelism and FSDP2 for
Llama-style models (the plan, the families and the steps are in :mod:`mx_nn.plan`)."""

from __future__ import annotations

import contextlib
import logging
import reprlib
from collections.abc import Iterator

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle

from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.convert import convert, convertible
from mx_nn.fsdp.check import check_fsdp_mx
from mx_nn.linear import MXLinear
from mx_nn.plan.apply import apply_compile, apply_fsdp, apply_tp
from mx_nn.plan.checks import (
    check_flags,
    check_not_parallelized,
    check_plan_modules,
    check_ties,
    check_tp_sizes,
    expand_plan,
    mark_parallelized,
)
from mx_nn.plan.families import ModelMap, find_model_map, unmapped_message
from mx_nn.plan.fused import FusedSplit, split_fused

__all__ = ["parallelize"]

logger = logging.getLogger("mx_nn")


def parallelize(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    recipe: str | MXRecipe | MXLinearConfig | None = "mxfp8",
    plan: dict[str, ParallelStyle] | None = None,
    sequence_parallel: bool = True,
    mx_comms: bool = True,
    mx_lm_head: bool = False,
    compile: bool = False,
    fsdp_mx_all_gather: bool = False,
) -> nn.Module:
    """Convert ``model`` to MX and parallelize it over ``mesh``, in place.

    Mesh: 1-D (any name but ``"dp"``): tensor parallel over it. 1-D named ``"dp"``:
    FSDP2 only. 2-D named ``("dp", "tp")``: tensor parallel on ``"tp"``, then
    ``fully_shard`` of each decoder block and of the root on ``"dp"``. A tensor-parallel
    dim of size 1 is left out (logged): the parameters stay plain tensors.

    Args:
        model: a Llama-style model (Hugging Face or torchtitan naming, found by
            structure) or any model with an explicit ``plan``.
        mesh: the device mesh, as above.
        recipe: MX recipe or config for ``mx_nn.convert``; None keeps the linears as
            they are. The LM head stays high precision unless ``mx_lm_head``.
        plan: fqn pattern (``*`` matches one path component) -> ParallelStyle, applied
            instead of the built-in plan; every pattern must match a module.
        sequence_parallel: shard norms and the residual stream along the sequence
            (dim 1). Where it cannot apply (no embedding or final norm found) it is
            logged and plain tensor parallelism runs.
        mx_comms: with sequence parallelism and a recipe, gather each attention and MLP
            input (and an MX head's, ``mx_lm_head``) as the linears' MX input cast
            (codes + scales, 0.52x bf16's bytes; ``mx_dtensor.PrepareMXModuleInput`` and
            ``MXColwiseParallel``): the same forward values, dW from a second cast of
            them. False gathers in high precision. No effect at tp=1. Either way the
            MX linears get mx-dtensor's MX styles (``mx_nn.plan.resolve``).
        mx_lm_head: convert the LM head too.
        compile: ``torch.compile`` each decoder block (in place, fqns unchanged).
        fsdp_mx_all_gather: FSDP2 gathers each decoder block's MXLinear weights as MX
            casts (rowwise in forward, columnwise in backward: 1 + 1/32 bytes per
            element against 2 for bf16; :mod:`mx_nn.fsdp.weight`) and reshards the
            blocks after forward; the same losses and gradients bit for bit. Needs a
            "dp" mesh dim, the built-in plan, each such weight's rows per dp rank
            (after TP) a whole number of MX blocks, and no activation checkpointing;
            eager only (not with ``compile``). Other weights gather as they are.

    Returns:
        ``model``, with the same state_dict keys (values become DTensors), except where
        the built-in plan splits fused projections (Phi-3's ``qkv_proj`` and
        ``gate_up_proj``, :mod:`mx_nn.plan.fused`, at every degree and mesh): their
        parts' keys (``qkv_proj.q.weight`` ...) replace the fused one, which still loads.

    Raises:
        TypeError: ``model`` not an ``nn.Module``, ``mesh`` not a DeviceMesh, ``recipe``,
            ``plan`` or a flag of another type, or a plan style on a module it cannot
            shard.
        ValueError: a model parallelized already (by ``parallelize``, ``fully_shard``
            or ``parallelize_module``: it holds DTensors), a mesh without the needed
            dims, a model it cannot map (the message lists its linears), a plan pattern
            matching nothing, a plan without a tensor-parallel mesh dim, ``mx_lm_head``
            without a recipe, ``compile`` without decoder blocks, head counts or
            feature sizes not divisible by the TP degree, MX shards not multiples of
            the block size, an ``fsdp_mx_all_gather`` it cannot apply (above), or what
            ``mx_nn.convert`` refuses (MXLinear layers of another config), or tied
            parameters under tensor parallelism other than the LM head's tie to the
            embedding (kept: one DTensor for both). All are
            checked before the model is changed: a refused call leaves it as it was.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {reprlib.repr(model)} ({type(model).__name__})"
        )
    tp_mesh, dp_mesh = _split_mesh(mesh)
    check_not_parallelized(model)
    check_flags(sequence_parallel=sequence_parallel, mx_comms=mx_comms, mx_lm_head=mx_lm_head,
                compile=compile, fsdp_mx_all_gather=fsdp_mx_all_gather)  # fmt: skip
    tp = tp_mesh.size() if tp_mesh is not None else 1
    config = None if recipe is None else _config(recipe)
    if mx_lm_head and config is None:
        raise ValueError("mx_lm_head=True converts the LM head, but recipe=None converts none")
    model_map = find_model_map(model)
    # Phi-3's fused projections become their parts first, so that every check sees the
    # modules the plan shards; a refusal puts them back (the model as it was).
    split = split_fused(model) if plan is None and model_map is None else None
    with _undone_on_error(split):
        if split is not None:
            model_map = find_model_map(model)
        if tp_mesh is not None and plan is None and model_map is None:
            raise ValueError(unmapped_message(model))
        if plan is not None and tp_mesh is None:
            raise ValueError(
                f"plan= is a tensor-parallel plan, but mesh_dim_names={mesh.mesh_dim_names} has "
                f"no tensor-parallel dim (FSDP2 only); leave plan out or add a 'tp' dim"
            )
        if compile and model_map is None:
            raise ValueError(
                f"compile=True compiles each decoder block, but {type(model).__name__} has none "
                f"parallelize can find; torch.compile the model after parallelize instead"
            )
        if tp_mesh is not None and plan is not None:
            explicit = expand_plan(model, plan)
            if tp > 1:
                check_plan_modules(model, explicit, tp_mesh)
        will_be_mx = _mx_linears_after_convert(model, model_map, config, mx_lm_head)
        if tp_mesh is not None:
            check_ties(model, tp, model_map, plan is not None)
        if tp_mesh is not None and plan is None:
            check_tp_sizes(model, model_map, tp, will_be_mx)
        if fsdp_mx_all_gather:
            check_fsdp_mx(model, model_map, will_be_mx, dp_mesh, tp, plan=plan, compile=compile)
    # All checks passed: from here on the model changes further (convert checks all its
    # layers before it swaps the first). Marked first, so that even a call that fails part way
    # leaves a model a second call refuses rather than changes again.
    mark_parallelized(model, mesh)
    # Order: convert first (tensor parallelism shards the MXLinear's own parameters, so
    # the styles see the final module types); tensor parallel next (it replaces
    # parameters by DTensors on "tp", which FSDP2 then shards further on "dp");
    # activation checkpointing is the model's own, wrapping whole blocks (parallelize
    # adds none); per-block compile after TP so the graphs trace the DTensor code, and
    # before FSDP so its per-block all-gather hooks stay outside the compiled graphs;
    # FSDP last, per block then the root, so each block's parameters gather together.
    if config is not None:
        head = model_map.head if model_map is not None else None
        with _undone_on_error(split):  # convert refuses before it swaps a layer
            convert(model, config, filter_fn=lambda _m, fqn: mx_lm_head or fqn != head)
    if tp_mesh is not None:
        apply_tp(model, tp_mesh, plan=plan, sequence_parallel=sequence_parallel,
                 mx_comms=mx_comms)  # fmt: skip
    if compile:
        apply_compile(model)
    if dp_mesh is not None:
        apply_fsdp(model, dp_mesh, mx_all_gather=fsdp_mx_all_gather)
    return model


@contextlib.contextmanager
def _undone_on_error(split: FusedSplit | None) -> Iterator[None]:
    try:
        yield
    except BaseException:
        if split is not None:
            split.undo()
        raise


def _config(recipe: str | MXRecipe | MXLinearConfig) -> MXLinearConfig:
    if isinstance(recipe, MXLinearConfig):
        return recipe
    if not isinstance(recipe, str | MXRecipe):
        raise TypeError(
            f"recipe must be a recipe name, MXRecipe, MXLinearConfig or None, got {recipe!r}"
        )
    return MXLinearConfig.from_recipe(recipe)


def _split_mesh(mesh: DeviceMesh) -> tuple[DeviceMesh | None, DeviceMesh | None]:
    """(tp mesh, dp mesh) of a 1-D or ("dp", "tp") mesh."""
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"mesh must be a torch.distributed DeviceMesh, got {type(mesh).__name__}")
    names = mesh.mesh_dim_names
    if mesh.ndim == 1:
        return (None, mesh) if names == ("dp",) else (mesh, None)
    if mesh.ndim == 2 and names == ("dp", "tp"):
        return mesh["tp"], mesh["dp"]
    raise ValueError(
        f"mesh must be 1-D (tensor parallel; or named ('dp',) for FSDP2 only) or 2-D with "
        f"mesh_dim_names=('dp', 'tp'), got a {mesh.ndim}-D mesh with mesh_dim_names={names}"
    )


def _mx_linears_after_convert(
    model: nn.Module, model_map: ModelMap | None, config: MXLinearConfig | None, mx_head: bool
) -> dict[str, int]:
    """fqn -> block size of every linear that will be an MXLinear after conversion."""
    head = model_map.head if model_map is not None else None
    out = {}
    for fqn, m in model.named_modules():
        if isinstance(m, MXLinear):
            out[fqn] = m.config.block_size
        elif config is not None and convertible(m, config) and (mx_head or fqn != head):
            out[fqn] = config.block_size
    return out
