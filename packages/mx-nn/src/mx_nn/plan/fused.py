"""Fused projections split into their parts, so that tensor parallelism gives each rank
its own heads.

Phi-3 computes q, k and v with one linear, ``self_attn.qkv_proj`` (rows ``[q; k; v]``),
and the MLP's gate and up with one, ``mlp.gate_up_proj`` (rows ``[gate; up]``). A
columnwise split of such a weight would give each rank a slice of the concatenation
(rank 0 all of q at tp=2), not its own heads. :func:`split_fused` replaces each by a
:class:`SplitLinear` holding the parts as separate ``nn.Linear`` layers (the same rows,
the same values) whose forward concatenates their outputs: on one process the same
function. Under tensor parallelism each part is split columnwise like any linear
(standard ``Shard(0)``; an MXLinear after ``convert``), so rank r computes
``[q_r; k_r; v_r]`` (``[gate_r; up_r]``), its own heads (hidden features) in the order
the model's forward slices. Phi-3's attention slices at ``config.num_attention_heads *
head_dim`` and ``num_key_value_heads * head_dim``: it gets a shallow copy of its config,
whose two head counts :class:`SplitLinearParallel` (the plan's style for the split
``qkv_proj``) divides by the TP degree with the parts' split (``apply_tp`` divides the
attention's own ``num_key_value_heads``).

State dicts hold the parts' keys (``qkv_proj.q.weight``, ``gate_up_proj.up.weight``...):
under TP standard ``Shard(0)`` DTensors, which DCP reshards across TP degrees; a state
dict with the fused key (``qkv_proj.weight``, as a Hugging Face checkpoint has it) loads
too, split into the parts by a load pre-hook.

Only the attention and MLP classes whose forward is known to slice the fused output
this way are split (:data:`SPLITS`): structure alone cannot tell ``[q; k; v]`` from an
interleaved layout, which a split would compute wrongly without an error.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["SPLITS", "FusedSplit", "SplitLinear", "SplitLinearParallel", "split_fused"]

_HEADS = ("num_attention_heads", "num_key_value_heads")  # the config counts forward reads

SPLITS: Mapping[str, str] = {
    # forward: q, k, v = qkv[..., :H*hd], [H*hd : (H+KV)*hd], [(H+KV)*hd :], with H from
    # self.config.num_attention_heads and KV from self.num_key_value_heads
    "Phi3Attention": "qkv_proj",
    # forward: gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    "Phi3MLP": "gate_up_proj",
    "GlmMLP": "gate_up_proj",
}
"""transformers class name -> its fused linear, for the classes whose forward (not
overridden) slices that linear's output as the parts :func:`split_fused` makes."""


class SplitLinear(nn.Module):
    """A linear stored as its row blocks: ``parts`` (name -> ``nn.Linear``, in row
    order), the output their outputs concatenated along the last dim.

    Args:
        parts: the row blocks, all with the same ``in_features``.
        heads_config: for a split ``qkv_proj``, the attention's config (a copy of its
            own) whose head counts :class:`SplitLinearParallel` makes per rank.

    Each part's output must be its ``out_features / tp`` (tp: the degree recorded by
    :class:`SplitLinearParallel`, 1 before): a part split without that style, or the
    style without its parts' split, raises instead of concatenating the wrong rows.
    """

    def __init__(self, parts: Mapping[str, nn.Linear], heads_config: object | None = None) -> None:
        super().__init__()
        ins = {p.in_features for p in parts.values()}
        if not parts or len(ins) != 1:
            raise ValueError(
                f"parts must be one or more linears with the same in_features, got "
                f"{ {n: (p.in_features, p.out_features) for n, p in parts.items()} }"
            )
        for name, part in parts.items():
            self.add_module(name, part)
        self.part_names = tuple(parts)
        self.in_features = ins.pop()
        self.out_features = sum(p.out_features for p in parts.values())
        self.heads_config = heads_config
        self.tp = 1
        self.register_load_state_dict_pre_hook(_load_fused)

    def parts(self) -> dict[str, nn.Linear]:
        """name -> part, in row order."""
        return {n: getattr(self, n) for n in self.part_names}

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, tp={self.tp}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for name, part in self.parts().items():
            y = part(x)
            if y.shape[-1] * self.tp != part.out_features:
                raise RuntimeError(
                    f"SplitLinear part {name!r} (out_features={part.out_features}) returned "
                    f"{y.shape[-1]} features at tp={self.tp}: split the parts and the "
                    f"SplitLinear together (the built-in plan does, with SplitLinearParallel)"
                )
            outs.append(y)
        return torch.cat(outs, dim=-1)


def _load_fused(module: SplitLinear, state_dict, prefix, *_args) -> None:
    """Split a fused ``weight`` / ``bias`` in ``state_dict`` into the parts' keys, as
    tensors of the parts' own layout (a DTensor's local slice, no communication)."""
    for suffix in ("weight", "bias"):
        fused = state_dict.pop(f"{prefix}{suffix}", None)
        if fused is None:
            continue
        if isinstance(fused, DTensor):
            fused = fused.full_tensor()
        if fused.shape[0] != module.out_features:
            raise ValueError(
                f"{prefix}{suffix} has {fused.shape[0]} rows, but the split "
                f"{prefix.rstrip('.')} has {module.out_features} "
                f"({ {n: p.out_features for n, p in module.parts().items()} })"
            )
        rows = [p.out_features for p in module.parts().values()]
        for (name, part), value in zip(module.parts().items(), fused.split(rows), strict=True):
            target = getattr(part, suffix)
            if isinstance(target, DTensor):
                value = distribute_tensor(
                    value, target.device_mesh, target.placements, src_data_rank=None
                )
            state_dict[f"{prefix}{name}.{suffix}"] = value


class SplitLinearParallel(ParallelStyle):
    """The plan's style for a :class:`SplitLinear` itself (its parts get their own
    columnwise styles): records the TP degree, and for a split ``qkv_proj`` divides its
    attention config's ``num_attention_heads`` and ``num_key_value_heads`` by it, so the
    attention slices this rank's ``[q_r; k_r; v_r]``.

    Example::

        plan = {"layers.*.self_attn.qkv_proj": SplitLinearParallel(),
                "layers.*.self_attn.qkv_proj.q": ColwiseParallel(), ...}
    """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, SplitLinear):
            raise TypeError(f"SplitLinearParallel applies to a SplitLinear, got {module!r}")
        tp = device_mesh.size()
        if module.tp != 1:
            raise ValueError(
                f"SplitLinearParallel was applied to this SplitLinear already (tp={module.tp})"
            )
        config = module.heads_config
        counts = {a: getattr(config, a) for a in _HEADS} if config is not None else {}
        if any(n % tp for n in counts.values()):
            raise ValueError(f"head counts {counts} are not divisible by tp={tp}")
        for attr, n in counts.items():
            setattr(config, attr, n // tp)
        module.tp = tp
        return module


@dataclasses.dataclass(frozen=True, kw_only=True)
class FusedSplit:
    """What :func:`split_fused` changed, and how to change it back."""

    fqns: tuple[str, ...]
    """The fused linears replaced, in module order."""
    replaced: tuple[tuple[nn.Module, str, nn.Module], ...]
    """(parent, child name, the original linear)."""
    configs: tuple[tuple[nn.Module, object], ...]
    """(attention, its original config)."""

    def undo(self) -> None:
        """Put the original linears and configs back (the model as it was)."""
        for parent, name, original in self.replaced:
            setattr(parent, name, original)
        for attention, config in self.configs:
            attention.config = config


def _known(module: nn.Module) -> str | None:
    """The fused linear's name if ``module``'s class is one of :data:`SPLITS` (or a
    subclass keeping its forward), else None."""
    for cls in type(module).__mro__:
        name = SPLITS.get(cls.__name__)
        if name is not None and cls.__module__.startswith("transformers."):
            return name if type(module).forward is cls.forward else None
    return None


def _plain(linear: nn.Module) -> bool:
    return (
        isinstance(linear, nn.Linear)
        and type(linear).forward is nn.Linear.forward
        and "forward" not in linear.__dict__
        and set(linear._parameters) <= {"weight", "bias"}
        and not linear._buffers
        and not linear._modules
        and not (linear._forward_hooks or linear._forward_pre_hooks)
    )


def _rows(module: nn.Module, where: str, name: str, linear: nn.Linear) -> dict[str, int]:
    """Part name -> rows of ``module``'s fused ``linear`` (its child ``name``)."""
    if name == "gate_up_proj":
        if linear.out_features % 2:
            raise ValueError(
                f"{where} has out_features={linear.out_features}: not two halves [gate; up]"
            )
        half = linear.out_features // 2
        return {"gate": half, "up": half}
    fqn = where.rpartition(".")[0] or "the model"
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(module, "num_key_value_heads", None)
    head_dim = getattr(module, "head_dim", None)
    if not all(isinstance(n, int) and n > 0 for n in (heads, kv, head_dim)):
        raise ValueError(
            f"split_fused cannot read the head counts of {fqn}: config.num_attention_heads="
            f"{heads!r}, num_key_value_heads={kv!r}, head_dim={head_dim!r}"
        )
    if getattr(config, "num_key_value_heads", kv) != kv:
        raise ValueError(
            f"{fqn}.num_key_value_heads={kv} differs from its config's {config.num_key_value_heads}"
        )
    rows = {"q": heads * head_dim, "k": kv * head_dim, "v": kv * head_dim}
    if sum(rows.values()) != linear.out_features:
        raise ValueError(
            f"{where} has out_features={linear.out_features}, not (heads + 2 x "
            f"key/value heads) x head_dim = ({heads} + 2 x {kv}) x {head_dim}"
        )
    return rows


def _parts(linear: nn.Linear, rows: dict[str, int]) -> dict[str, nn.Linear]:
    """Linears over ``linear``'s row blocks: their parameters are views of its tensors
    (no copy; tensor parallelism and FSDP2 make their own shards)."""
    out, start = {}, 0
    weight, bias = linear.weight, linear.bias
    for name, n in rows.items():
        part = nn.Linear(linear.in_features, n, bias=bias is not None, device="meta")
        part.weight = nn.Parameter(weight.detach()[start : start + n], weight.requires_grad)
        if bias is not None:
            part.bias = nn.Parameter(bias.detach()[start : start + n], bias.requires_grad)
        out[name], start = part, start + n
    return out


def split_fused(model: nn.Module) -> FusedSplit | None:
    """Replace each fused linear of a :data:`SPLITS` class in ``model`` by a
    :class:`SplitLinear` of its parts (``q``, ``k``, ``v`` or ``gate``, ``up``: views of
    its rows), and give each split attention a shallow copy of its config (module doc).
    ``parallelize`` calls it before its checks (and undoes it when one refuses).

    Args:
        model: any model; only modules of the :data:`SPLITS` classes change.

    Returns:
        What changed (:class:`FusedSplit`), or None where nothing is fused.

    Raises:
        ValueError: a fused linear that is not a plain ``nn.Linear``, or whose rows do
            not match the head counts (before any change).
    """
    sites = []
    for fqn, module in model.named_modules():
        name = _known(module)
        linear = getattr(module, name, None) if name is not None else None
        if linear is None or isinstance(linear, SplitLinear):
            continue
        where = f"{fqn}.{name}" if fqn else name
        if not _plain(linear):
            raise ValueError(
                f"split_fused splits {where} only as a plain nn.Linear (nn.Linear's "
                f"forward, weight and bias, no hooks), got {type(linear).__name__}"
            )
        sites.append((fqn, module, name, linear, _rows(module, where, name, linear)))
    if not sites:
        return None
    replaced, configs = [], []
    for _fqn, module, name, linear, rows in sites:
        heads_config = None
        if set(rows) == {"q", "k", "v"}:
            configs.append((module, module.config))
            heads_config = module.config = copy.copy(module.config)
        setattr(module, name, SplitLinear(_parts(linear, rows), heads_config))
        replaced.append((module, name, linear))
    fqns = tuple(f"{fqn}.{name}" if fqn else name for fqn, _m, name, _l, _r in sites)
    return FusedSplit(fqns=fqns, replaced=tuple(replaced), configs=tuple(configs))
