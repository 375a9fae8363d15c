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
from mx_nn.plan.families import Family, ModelMap
from mx_nn.plan.norms import across_heads

__all__ = [
    "check_flags",
    "check_not_parallelized",
    "check_plan_modules",
    "check_tp_sizes",
    "check_ties",
    "expand_plan",
    "mark_parallelized",
]

# Models parallelize has changed, with the mesh it used: a second call is refused even
# where the first left no DTensor behind (tp=1), so a model is parallelized once.
_PARALLELIZED: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def mark_parallelized(model: nn.Module, mesh: DeviceMesh) -> None:
    """Record that ``parallelize`` is changing ``model`` on ``mesh``.

    Args:
        model: the model being parallelized (held weakly).
        mesh: its device mesh, quoted in a later refusal (:func:`check_not_parallelized`).
    """
    _PARALLELIZED[model] = f"mesh shape {tuple(mesh.mesh.shape)}, names {mesh.mesh_dim_names}"


def check_not_parallelized(model: nn.Module) -> None:
    """Refuse a model ``parallelize`` (or ``fully_shard``) ran on, in whole or part, or
    that holds DTensor parameters or buffers (``parallelize_module``, ``distribute_tensor``).

    Args:
        model: the model ``parallelize`` was given.
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


def check_ties(model: nn.Module, tp: int, model_map: ModelMap | None, explicit: bool) -> bool:
    """Allow the one tie the built-in plan keeps (the LM head's weight is the embedding's:
    both are split along the vocabulary, ``Shard(0)``, so one DTensor serves both) and
    refuse every other parameter held under two names when tensor parallelism runs (each
    style would replace its module's parameter by a DTensor of its own, ending the tie
    without an error).

    Args:
        model: the model to parallelize.
        tp: the tensor-parallel degree.
        model_map: its family's map (None: no built-in plan), naming the embedding and head.
        explicit: an explicit ``plan=`` was given, which keeps no tie.
    Returns:
        Whether the head-embedding tie is there to keep (never with ``explicit``).
    Raises:
        ValueError: naming the parameter's names and how to proceed.
    """
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    groups = [n for n in names.values() if len(n) > 1]
    if not groups:
        return False
    head_tie = None
    if model_map is not None and model_map.embedding and model_map.head:
        head_tie = {f"{model_map.embedding}.weight", f"{model_map.head}.weight"}
    keep = not explicit and head_tie is not None and any(set(g) == head_tie for g in groups)
    rest = [g for g in groups if not (keep and set(g) == head_tie)]
    if tp > 1 and rest:
        why = (
            "an explicit plan= cannot keep a tie" if explicit else
            "only the LM head's tie to the embedding is kept: both split along the vocabulary"
        )  # fmt: skip
        raise ValueError(
            f"model ties {' and '.join(map(repr, rest[0]))} (one Parameter), but tensor "
            f"parallelism (tp={tp}) shards each module's parameters into a DTensor of its "
            f"own, which would untie them ({why}); untie them first (e.g. "
            f"tie_word_embeddings=False) or use tp=1"
        )
    return keep


def check_flags(**flags: object) -> None:
    """Refuse a flag argument that is not a bool (``compile="no"`` would be truthy).

    Args:
        flags: argument name -> the value given.
    Raises:
        TypeError: naming the argument and the value given.
    """
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool (True or False), got {value!r}")


def expand_plan(model: nn.Module, plan: dict[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """Expand an explicit plan's fqn patterns to modules.

    Args:
        model: the model to parallelize.
        plan: fqn pattern -> ``ParallelStyle``; patterns match whole dotted fqns,
            component by component (``fnmatch``: ``*`` within one component).
    Returns:
        fqn -> style of every module a pattern matches (a later pattern wins).
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

    Args:
        model: the model to parallelize.
        explicit: fqn -> style, as :func:`expand_plan` returns it.
        tp_mesh: the tensor-parallel mesh (1-D).
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


def _heads(model: nn.Module, block: str, family: Family) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim) of one block's attention."""
    fqn = f"{block}.{family.path('attention')}"
    attn = model.get_submodule(fqn)
    counts = [getattr(attn, a, None) for a in ("n_heads", "n_kv_heads", "head_dim")]
    if all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in counts):
        return counts[0], counts[1], counts[2]  # torchtitan's attention, fused or not
    q, k = (model.get_submodule(f"{block}.{family.path(f'attention.qkv_linear.w{p}')}")
            for p in "qk")  # fmt: skip
    head_dim = getattr(attn, "head_dim", None)
    if not isinstance(head_dim, int):
        n = next((getattr(attn, a) for a in ("n_heads", "num_heads") if hasattr(attn, a)), None)
        if not isinstance(n, int) or n <= 0:
            raise ValueError(
                f"parallelize cannot read the head counts of {fqn}: it has no int head_dim, "
                f"n_heads or num_heads attribute"
            )
        head_dim = q.out_features // n
    return q.out_features // head_dim, k.out_features // head_dim, head_dim


def _check_inside(model: nn.Module, block: str, family: Family, key: str, head_dim: int) -> None:
    """Refuse what tensor parallelism would split wrongly inside attention (``key``
    "attention") or the MLP ("feed_forward"): parameters the module holds itself (per-head
    sinks, differential attention's lambdas: the plan does not split them, while each
    rank holds only its own heads), linears the plan does not know, and norms over more
    than one head that the plan does not split (BitNet's ``attn_sub_norm``). Per-head
    norms (one [head_dim] weight, Qwen3's and Gemma3's q_norm) are fine, and so are the
    family's planned norms over a whole projection (OLMo2's q_norm and k_norm:
    :class:`~mx_nn.plan.norms.HeadShardedNorm`) where they are as wide as it or per head."""
    path = family.path(key)
    fqn = f"{block}.{path}"
    module = model.get_submodule(fqn)
    inside = [(p[len(path) + 1 :], p) for p in family.linears() if p.startswith(f"{path}.")]
    planned = {rel.split(".", 1)[0] for rel, _ in inside}
    projections = {  # planned norm's name -> the projection it normalises
        n[len(path) + 1 :]: model.get_submodule(f"{block}.{p}")
        for n, p in family.head_norms()
        if n.startswith(f"{path}.") and "." not in n[len(path) + 1 :]
    }
    fix = "for this model use tp=1 (FSDP2 only) or pass plan="
    own = [(n, tuple(t.shape)) for n, t in module.named_parameters(recurse=False)]
    if own:
        raise ValueError(
            f"parallelize cannot split {fqn}: it holds parameters of its own ({own}) that "
            f"the plan does not split, while tensor parallelism gives each rank only its "
            f"own heads and features; {fix}"
        )
    for name, child in module.named_children():
        params = list(child.parameters())
        if name in planned or not params:
            continue
        what = f"its {name} ({type(child).__name__}, parameters {[tuple(t.shape) for t in params]})"
        if any(isinstance(m, nn.Linear) for m in child.modules()):
            raise ValueError(
                f"parallelize cannot split {fqn}: {what} is a linear the plan does not "
                f"know (it plans {sorted(planned)}); {fix}"
            )
        per_head = key == "attention" and all(t.ndim == 1 and t.numel() == head_dim for t in params)
        if name in projections and (per_head or across_heads(child, projections[name])):
            continue
        if not per_head:
            planned_norms = (
                f" (it plans {sorted(projections)} only as wide as their projection's output)"
                if projections else ""
            )  # fmt: skip
            raise ValueError(
                f"parallelize cannot split {fqn}: {what} works across heads "
                f"(head_dim={head_dim}), and tensor parallelism gives each rank only its own "
                f"heads{planned_norms}. Per-head norms (one [head_dim] weight, as Qwen3's and "
                f"Gemma3's q_norm) are fine; {fix}"
            )


def check_tp_sizes(model: nn.Module, model_map: ModelMap, tp: int, mx: dict[str, int]) -> None:
    """Refuse head counts and split feature sizes of the built-in plan that ``tp`` does
    not divide, MX linears whose shards are not whole MX blocks, and attention parameters
    that work across heads.

    Args:
        model: the model to parallelize.
        model_map: its family's map (blocks, embedding, head).
        tp: the tensor-parallel degree.
        mx: fqn -> block size of every linear that will be an MXLinear.
    Raises:
        ValueError: naming the module, the sizes and ``tp``.
    """
    family = model_map.family
    _check_stacks(model, model_map)
    colwise = set(family.colwise())
    split = {p: "out_features" if p in colwise else "in_features" for p in family.linears()}
    for b in model_map.blocks:
        heads, kv_heads, head_dim = _heads(model, b, family)
        attn = f"{b}.{family.path('attention')}"
        if heads % tp or kv_heads % tp:
            raise ValueError(
                f"{attn} has {heads} query and {kv_heads} key/value heads: both "
                f"must be divisible by the tensor-parallel degree tp={tp}"
            )
        for key in ("attention", "feed_forward"):
            _check_inside(model, b, family, key, head_dim)
        for suffix, dim in split.items():
            fqn = f"{b}.{suffix}"
            _check_split(fqn, dim, getattr(model.get_submodule(fqn), dim), tp, mx.get(fqn))
    if model_map.embedding is not None:
        emb = model.get_submodule(model_map.embedding)
        _check_split(model_map.embedding, "num_embeddings", emb.num_embeddings, tp, None)
    if model_map.head is not None:
        head = model.get_submodule(model_map.head)
        _check_split(model_map.head, "out_features", head.out_features, tp, mx.get(model_map.head))


def _check_stacks(model: nn.Module, model_map: ModelMap) -> None:
    """Refuse a layer stack (``nn.ModuleList`` / ``ModuleDict``) of decoder blocks that
    holds other layers with parameters (a hybrid model's linear-attention layers): the
    plan would leave them unsplit, with sequence parallelism fed a residual stream split
    along the sequence."""
    blocks = set(model_map.blocks)
    for parent in dict.fromkeys(b.rpartition(".")[0] for b in blocks):
        stack = model.get_submodule(parent)
        if not isinstance(stack, nn.ModuleList | nn.ModuleDict):
            continue
        for name, layer in stack.named_children():
            fqn = f"{parent}.{name}" if parent else name
            if fqn not in blocks and next(layer.parameters(), None) is not None:
                ours = sorted(b for b in blocks if b.startswith(f"{parent}."))
                raise ValueError(
                    f"parallelize cannot split {fqn} ({type(layer).__name__}): it sits in "
                    f"{parent or 'the model'} among the {model_map.family.name} blocks "
                    f"({', '.join(ours[:4])}{', ...' if len(ours) > 4 else ''}) but is not "
                    f"one: the plan would leave it unsplit (with sequence parallelism, fed a "
                    f"residual stream split along the sequence); for this model use tp=1 "
                    f"(FSDP2 only) or pass plan="
                )


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
