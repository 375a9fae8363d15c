"""What ``parallelize(..., fsdp_mx_all_gather=True)`` checks before it changes the model
(the all-gathers themselves: :mod:`mx_nn.fsdp.weight`)."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from mx_nn.fsdp.weight import row_chunks
from mx_nn.plan.families import ModelMap

__all__ = ["check_fsdp_mx"]


def check_fsdp_mx(
    model: nn.Module,
    model_map: ModelMap | None,
    mx: dict[str, int],
    dp_mesh: DeviceMesh | None,
    tp: int,
    *,
    plan: dict | None,
    compile: bool,
) -> None:
    """Refuse ``fsdp_mx_all_gather=True`` where it cannot apply: no "dp" mesh dim, no
    decoder blocks, an explicit TP plan (its splits are unknown here), ``compile``,
    activation checkpointing that parallelize can see (Hugging Face's
    ``is_activation_checkpointing``), no MXLinear in the blocks, or a block's MXLinear
    whose rows per dp rank are not whole MX blocks.

    Args:
        model: the model, before any change.
        model_map: its family's map (None: unmapped).
        mx: fqn -> block size of every linear that will be an MXLinear.
        dp_mesh: the "dp" mesh, or None.
        tp: the tensor-parallel degree (1 without TP).
        plan: the explicit TP plan, or None.
        compile: whether the blocks will be compiled.

    Raises:
        ValueError: naming the layer, its sizes and the dp degree where it is one.
    """
    why = None
    if dp_mesh is None:
        why = "the mesh has no 'dp' dim, so FSDP2 does not run"
    elif model_map is None:
        why = "parallelize found no decoder blocks to shard one by one"
    elif plan is not None and tp > 1:
        why = "with an explicit plan the rows each rank holds after TP are unknown here"
    elif compile:
        # Seen on torch 2.13: dynamo traces MXLinear's backward while tracing its forward,
        # when FSDP's buffer still holds the rowwise cast; the check of the orientation
        # fails there and dynamo runs the whole block eagerly instead.
        why = (
            "torch.compile traces each layer's backward together with its forward, but "
            "the backward's columnwise cast arrives with a later all-gather (dynamo falls "
            "back to eager for the block); use compile=False"
        )
    elif _checkpointing(model):
        why = (
            "activation checkpointing would recompute the forward inside backward, where "
            "FSDP gathers the backward's columnwise cast"
        )
    if why is not None:
        raise ValueError(f"fsdp_mx_all_gather=True cannot apply: {why}")
    dp, colwise = dp_mesh.size(), set(model_map.family.colwise())
    layers = [(b, f) for b in model_map.blocks for f in mx if f.startswith(f"{b}.")]
    if not layers:
        raise ValueError(
            "fsdp_mx_all_gather=True cannot apply: no decoder block has an MXLinear "
            "(recipe=None and no MXLinear in the model?)"
        )
    for block, fqn in layers:
        out = model.get_submodule(fqn).out_features
        split = tp if fqn[len(block) + 1 :] in colwise else 1
        rows, bs = out // split, mx[fqn]
        chunks = row_chunks(rows, dp)
        if rows % dp or any(c % bs for c in chunks):
            tp_part = f" (its tp={tp} shard: {rows} rows)" if split > 1 else ""
            raise ValueError(
                f"fsdp_mx_all_gather=True: {fqn}.out_features={out}{tp_part} splits over "
                f"dp={dp} into rows {chunks} per rank; each must be the same multiple of "
                f"the MX block size {bs} (the columnwise cast's blocks run along these "
                f"rows). Use a dp degree that divides its {rows // bs} blocks, or "
                "fsdp_mx_all_gather=False"
            )


def _checkpointing(model: nn.Module) -> bool:
    """Whether a Hugging Face model has activation checkpointing on (transformers 5
    renamed ``is_gradient_checkpointing`` to ``is_activation_checkpointing``)."""
    for attr in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), attr):
            return bool(getattr(model, attr))
    return False
