"""What ``parallelize`` checks before it changes the model: its arguments, that the model
is not parallelized yet, an explicit plan's styles against their modules, and the
tensor-parallel sizes of the built-in plan (FSDP2's MX gathers: :mod:`mx_nn.fsdp.check`).
"""

from __future__ import annotations

import fnmatch
import itertools
import weakref

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from mx_dtensor import MXColwiseParallel, MXRowwiseParallel
from mx_dtensor.styles.common import check_linear
from mx_nn.plan.tp_plan import ModelMap, Naming

__all__ = [
    "check_flags",
    "check_not_parallelized",
    "check_plan_modules",
    "check_tp_sizes",
    "check_untied",
    "expand_plan",
    "mark_parallelized",
]

# Models parallelize has changed, with the mesh it used: a second call is refused even
# where the first left no DTensor behind (tp=1), so a model is parallelized once.
_PARALLELIZED: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def mark_parallelized(model: nn.Module, mesh: DeviceMesh) -> None:
    """Record that ``parallelize`` is changing ``model`` on ``mesh``."""
    _PARALLELIZED[model] = f"mesh shape {tuple(mesh.mesh.shape)}, names {mesh.mesh_dim_names}"


def check_not_parallelized(model: nn.Module) -> None:
    """Refuse a model ``parallelize`` (or ``fully_shard``) ran on, in whole or part, or
    that holds DTensor parameters or buffers (``parallelize_module``, ``distribute_tensor``).

    Raises:
        ValueError: naming the module or tensor found and what was applied to it.
    """
    why = None
    for fqn, m in model.named_modules():
        where = f"its submodule {fqn!r}" if fqn else "it"
        if m in _PARALLELIZED:
            why = f"mx_nn.parallelize already ran on {where} ({_PARALLELIZED[m]})"
        elif isinstance(m, FSDPModule):
            why = f"fully_shard (FSDP2) already ran on {where}"
        if why is not None:
            break
    if why is None:
        tensors = itertools.chain(model.named_parameters(), model.named_buffers())
        name, t = next(((n, t) for n, t in tensors if isinstance(t, DTensor)), (None, None))
        if name is not None:
            why = (
                f"its {name!r} is already a DTensor ({t.placements} on a mesh of shape "
                f"{tuple(t.device_mesh.mesh.shape)}): tensor parallelism or FSDP2 ran on it"
            )
    if why is not None:
        raise ValueError(
            f"model must not be parallelized yet, but {type(model).__name__} is: {why}. "
            f"parallelize changes a model once, in place (its head counts, parameters and "
            f"hooks); call it on a freshly built model"
        )


def check_untied(model: nn.Module, tp: int) -> None:
    """Refuse parameters held under two names (tied weights, e.g. a Hugging Face model's
    ``tie_word_embeddings``) when tensor parallelism runs: each style replaces its own
    module's parameter by a new DTensor, so the tie would end without an error.

    Raises:
        ValueError: naming the parameter's names.
    """
    if tp == 1:
        return
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    tied = next((n for n in names.values() if len(n) > 1), None)
    if tied is not None:
        raise ValueError(
            f"model ties {' and '.join(map(repr, tied))} (one Parameter), but tensor "
            f"parallelism (tp={tp}) shards each module's parameters into a DTensor of its "
            f"own, which would untie them; untie them first (e.g. tie_word_embeddings=False)"
        )


def check_flags(**flags: object) -> None:
    """Refuse a flag argument that is not a bool (``compile="no"`` would be truthy).

    Raises:
        TypeError: naming the argument and the value given.
    """
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool (True or False), got {value!r}")


def expand_plan(model: nn.Module, plan: dict[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """fqn -> style of every module a ``plan`` pattern matches (``*``: one component).

    Raises:
        TypeError: ``plan`` not a dict, or a value not a ParallelStyle.
        ValueError: a pattern matching no module (``parallelize_module`` only warns).
    """
    if not isinstance(plan, dict):
        raise TypeError(f"plan must be a dict of fqn pattern -> ParallelStyle, got {plan!r}")
    fqns = [fqn for fqn, _ in model.named_modules() if fqn]
    out: dict[str, ParallelStyle] = {}
    for pattern, style in plan.items():
        if not isinstance(pattern, str):
            raise TypeError(f"plan keys must be fqn pattern strings, got {pattern!r}")
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"plan[{pattern!r}] must be a ParallelStyle, got {style!r}")
        atoms = pattern.split(".")
        hits = [
            f
            for f in fqns
            if len(parts := f.split(".")) == len(atoms)
            and all(fnmatch.fnmatchcase(p, a) for p, a in zip(parts, atoms, strict=True))
        ]
        if not hits:
            raise ValueError(
                f"plan key {pattern!r} matches no module of {type(model).__name__} "
                f"(its modules include {', '.join(fqns[:12])})"
            )
        out.update(dict.fromkeys(hits, style))
    return out


def check_plan_modules(
    model: nn.Module, explicit: dict[str, ParallelStyle], tp_mesh: DeviceMesh
) -> None:
    """What the linear styles of an expanded plan check when ``parallelize_module``
    applies them, asked before anything is applied: PyTorch's colwise and rowwise styles
    take an ``nn.Linear`` or ``nn.Embedding``, mx-dtensor's MX ones an ``nn.Linear``
    with whole MX blocks per rank (``mx_dtensor.styles.common.check_linear``).

    Raises:
        TypeError: a style on a module of a type it cannot shard.
        ValueError: an MX style whose linear splits into partial MX blocks.
    """
    for fqn, style in explicit.items():
        module = model.get_submodule(fqn)
        mx = isinstance(style, MXColwiseParallel | MXRowwiseParallel)
        kinds = (nn.Linear,) if mx else (nn.Linear, nn.Embedding)
        if isinstance(style, ColwiseParallel | RowwiseParallel) and not isinstance(module, kinds):
            raise TypeError(
                f"plan: {type(style).__name__} on {fqn!r} shards "
                f"{' and '.join(k.__name__ for k in kinds)} modules (and subclasses), but "
                f"{fqn!r} is a {type(module).__name__}"
            )
        if mx:
            split = 0 if isinstance(style, MXColwiseParallel) else 1
            check_linear(type(style).__name__, module, tp_mesh, split, style.block_size)


def _heads(attn: nn.Module, q: nn.Linear, k: nn.Linear, fqn: str) -> tuple[int, int]:
    head_dim = getattr(attn, "head_dim", None)
    if not isinstance(head_dim, int):
        n = next((getattr(attn, a) for a in ("n_heads", "num_heads") if hasattr(attn, a)), None)
        if not isinstance(n, int) or n <= 0:
            raise ValueError(
                f"parallelize cannot read the head counts of {fqn}: it has no int head_dim, "
                f"n_heads or num_heads attribute"
            )
        head_dim = q.out_features // n
    return q.out_features // head_dim, k.out_features // head_dim


def check_tp_sizes(model: nn.Module, model_map: ModelMap, tp: int, mx: dict[str, int]) -> None:
    """Refuse head counts and split feature sizes of the built-in plan that ``tp`` does
    not divide, and MX linears whose shards are not whole MX blocks. ``mx``: fqn ->
    block size of every linear that will be an MXLinear.

    Raises:
        ValueError: naming the module, the sizes and ``tp``.
    """
    n: Naming = model_map.naming
    split = {  # fqn suffix -> which dim is split across ranks
        **{f"{n.attention}.{p}": "out_features" for p in n.qkv},
        f"{n.attention}.{n.out}": "in_features",
        **{f"{n.mlp}.{p}": "out_features" for p in n.gate_up},
        f"{n.mlp}.{n.down}": "in_features",
    }
    for b in model_map.blocks:
        attn = model.get_submodule(f"{b}.{n.attention}")
        q, k = (model.get_submodule(f"{b}.{n.attention}.{p}") for p in n.qkv[:2])
        heads, kv_heads = _heads(attn, q, k, f"{b}.{n.attention}")
        if heads % tp or kv_heads % tp:
            raise ValueError(
                f"{b}.{n.attention} has {heads} query and {kv_heads} key/value heads: both "
                f"must be divisible by the tensor-parallel degree tp={tp}"
            )
        for suffix, dim in split.items():
            fqn = f"{b}.{suffix}"
            _check_split(fqn, dim, getattr(model.get_submodule(fqn), dim), tp, mx.get(fqn))
    if model_map.embedding is not None:
        emb = model.get_submodule(model_map.embedding)
        _check_split(model_map.embedding, "num_embeddings", emb.num_embeddings, tp, None)
    if model_map.head is not None:
        head = model.get_submodule(model_map.head)
        _check_split(model_map.head, "out_features", head.out_features, tp, mx.get(model_map.head))


def _check_split(fqn: str, dim: str, size: int, tp: int, block: int | None) -> None:
    if size % tp:
        raise ValueError(
            f"{fqn}.{dim}={size} is not divisible by the tensor-parallel degree tp={tp}"
        )
    if block is not None and (size // tp) % block:
        raise ValueError(
            f"{fqn}.{dim}={size} splits into shards of {size // tp} at tp={tp}, not a multiple "
            f"of the MX block size {block}: MX casts need whole blocks per shard"
        )
