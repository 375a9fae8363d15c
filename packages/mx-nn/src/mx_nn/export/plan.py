"""What an export writes for a model: each state-dict tensor under its Hugging Face name,
MX layers' weights as codes and scales, everything else as it is; the ``ignore`` list
and the Hugging Face config. Made from the module tree alone (a meta-device model
does), so every check runs before anything is read or written.

Names: mx-train's :class:`mx_nn.models.llama.Llama` gets Hugging Face Llama names
(:mod:`mx_nn.export.llama_names`); any other model (a Hugging Face model converted by
``mx_nn.convert``) keeps its own, wrapper segments (``_orig_mod``,
``_checkpoint_wrapped_module``) left out.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from mx_nn.config import MXLinearConfig
from mx_nn.export import llama_names
from mx_nn.export.safetensors_io import TensorSpec
from mx_nn.export.schemes import BLOCK, Scheme
from mx_nn.export.weights import storage_of
from mx_nn.linear import MXLinear
from mx_nn.models.llama import Llama

__all__ = ["Entry", "ExportPlan", "clean_fqn", "plan_model"]

_WRAPPERS = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")
_SHOWN = 6  # layers an error names before it counts the rest


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One tensor of the model and what it becomes."""

    key: str
    """The model's state-dict key (where to read it)."""
    name: str
    """Its Hugging Face name (``<module>.weight`` for an MX layer's weight)."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    config: MXLinearConfig | None = None
    """The MX layer's config when this is an MX layer's weight (stored as codes)."""
    rope_heads: int = 0
    """Heads whose rows are reordered for Hugging Face's RoPE (0: none)."""

    def specs(self, scheme: Scheme) -> list[TensorSpec]:
        """The tensors written for this entry, in order."""
        if self.config is None:
            return [TensorSpec(name=self.name, dtype=self.dtype, shape=self.shape)]
        module = self.name.removesuffix(".weight")
        n, k = self.shape
        dtype, shape = storage_of(scheme.fmt.value, (n, k))
        return [
            TensorSpec(name=f"{module}.{scheme.codes_name}", dtype=dtype, shape=shape),
            TensorSpec(
                name=f"{module}.{scheme.scale_name}", dtype=torch.uint8, shape=(n, k // BLOCK)
            ),  # fmt: skip
        ]


@dataclass(frozen=True, kw_only=True)
class ExportPlan:
    """Every tensor to write (state-dict order), the ``ignore`` list and the config."""

    entries: tuple[Entry, ...]
    ignore: tuple[str, ...]
    hf_config: dict
    llama: bool
    """Whether the model is mx-nn's Llama (names mapped)."""


def clean_fqn(fqn: str) -> str:
    """A module or state-dict name without wrapper segments.

    Args:
        fqn: a dotted name.
    Returns:
        ``fqn`` without its ``_orig_mod``, ``_checkpoint_wrapped_module`` and
        ``_fsdp_wrapped_module`` components.
    """
    return ".".join(p for p in fqn.split(".") if p not in _WRAPPERS)


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(repr(n) for n in names[:_SHOWN]) + more


def _model_class(model: nn.Module) -> str:
    # fully_shard gives the model a class of its own (FSDP<Name>, made in torch).
    for cls in type(model).__mro__:
        if not cls.__module__.startswith("torch."):
            return cls.__name__
    return type(model).__name__


def _hf_config(model: nn.Module, hf_config: object) -> dict:
    if hf_config is not None:
        raw = hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config
        if not isinstance(raw, dict):
            raise TypeError(f"hf_config must be a dict or have to_dict(), got {type(hf_config)}")
        return copy.deepcopy(raw)
    if isinstance(model, Llama):
        return llama_names.hf_config(model.config)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        raw = config.to_dict()
        if not raw.get("architectures"):  # as save_pretrained sets it
            raw["architectures"] = [_model_class(model)]
        raw.pop("quantization_config", None)
        raw["dtype"] = "bfloat16"  # what compressed-tensors decompresses MX weights to
        raw.pop("torch_dtype", None)
        return raw
    raise ValueError(
        f"export: {type(model).__name__} is neither mx_nn.models.llama.Llama nor a Hugging "
        f"Face model (no config.to_dict()); pass hf_config= (the config.json it loads as)"
    )


def plan_model(model: nn.Module, scheme: Scheme, hf_config: object = None) -> ExportPlan:
    """What an export of ``model`` in ``scheme`` writes (module doc).

    Args:
        model: the MX model (a meta-device skeleton will do: only its module tree, shapes
            and dtypes are read).
        scheme: the export's :class:`~mx_nn.export.schemes.Scheme`.
        hf_config: the Hugging Face config to write (a dict or an object with
            ``to_dict()``), or None for the model's own.
    Returns:
        The :class:`ExportPlan`: entries in state-dict order (a tied copy left out where
        the config ties embeddings), the high-precision linears and embeddings to
        ``ignore``, the config.
    Raises:
        TypeError: ``model`` not a module; ``hf_config`` neither a dict nor ``to_dict()``.
        ValueError: no MXLinear in ``model``; an MX layer whose weight format or block
            size the scheme does not store; an MX layer's weight tied to another tensor;
            a model with no Hugging Face config and no ``hf_config``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    mx = {clean_fqn(f): m for f, m in model.named_modules() if isinstance(m, MXLinear)}
    if not mx:
        raise ValueError(
            f"export: {type(model).__name__} has no MXLinear layer, so nothing to store in "
            f"{scheme.name}: convert it (mx_nn.convert) and train it in MX first, or save it "
            f"in high precision (save_pretrained)"
        )
    wrong = [f for f, m in mx.items() if m.config.weight_fmt != scheme.fmt]
    if wrong:
        fmts = sorted({mx[f].config.weight_fmt.value for f in wrong})
        raise ValueError(
            f"export: scheme={scheme.name!r} stores {scheme.fmt.value} weights, but "
            f"{len(wrong)} MX layer(s) trained with {', '.join(fmts)} weights "
            f"({_listed(wrong)}); export in the scheme the model was trained in"
        )
    odd = [f for f, m in mx.items() if m.config.block_size != BLOCK]
    if odd:
        raise ValueError(
            f"export: {scheme.name} stores blocks of {BLOCK}; {_listed(odd)} trained with "
            f"block_size {mx[odd[0]].config.block_size}"
        )
    config = _hf_config(model, hf_config)
    llama = isinstance(model, Llama)
    rename = llama_names.hf_key if llama else (lambda k: k)
    module_name = llama_names.hf_module if llama else (lambda f: f)
    tied = bool(config.get("tie_word_embeddings", False))
    mx_weights = {f"{f}.weight": m for f, m in mx.items()}
    seen: dict[int, str] = {}
    entries = []
    for raw_key, t in model.state_dict(keep_vars=True).items():
        key = clean_fqn(raw_key)
        first = seen.setdefault(id(t), key)
        if first != key and (key in mx_weights or first in mx_weights):
            raise ValueError(
                f"export: {first!r} and {key!r} are one tensor, and an MX layer's weight: "
                f"the checkpoint cannot hold it both as MX codes and as it is (untie them, "
                f"or leave the layer in high precision)"
            )
        if first != key and tied:
            continue  # a tied copy: the loader ties it again (tie_word_embeddings)
        layer = mx_weights.get(key)
        entries.append(Entry(
            key=key, name=rename(key), shape=tuple(t.shape), dtype=t.dtype,
            config=None if layer is None else layer.config,
            rope_heads=llama_names.rope_heads(key, model.config) if llama else 0,
        ))  # fmt: skip
    ignore = [
        module_name(clean_fqn(f))
        for f, m in model.named_modules()
        if isinstance(m, nn.Linear | nn.Embedding) and not isinstance(m, MXLinear)
    ]
    return ExportPlan(entries=tuple(entries), ignore=tuple(dict.fromkeys(ignore)),
                      hf_config=config, llama=llama)  # fmt: skip
