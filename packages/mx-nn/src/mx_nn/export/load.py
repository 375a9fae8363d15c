"""Import: a compressed-tensors MX folder (as :func:`mx_nn.export.export` writes it, or
any in the same two layouts) into an MX model, to train it further (fine-tuning a
served model).

Each MX layer's weight becomes the high-precision tensor whose training cast gives the
stored codes and scales back, bit for bit (:func:`mx_nn.export.weights.weight_for`):
the dequantized values, one element per block raised by one unit in the last place
where the layer's scale rule (RCEIL, CEIL) would otherwise pick a scale one lower for
them. Everything else is loaded as stored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from mx_nn.export import llama_names
from mx_nn.export.hf_dir import INDEX
from mx_nn.export.plan import Entry, clean_fqn, plan_model
from mx_nn.export.safetensors_io import read_header, read_tensor
from mx_nn.export.schemes import Scheme, scheme_from_config
from mx_nn.export.weights import check_compute_dtype, weight_for

__all__ = ["load_pretrained", "read_config"]

_SINGLE = "model.safetensors"
_SHOWN = 6


def read_config(folder: str | os.PathLike) -> dict:
    """config.json of a model folder.

    Args:
        folder: a Hugging Face model folder.
    Returns:
        The parsed config (a dict).
    Raises:
        ValueError: no config.json there, or not JSON.
    """
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ValueError(f"{str(folder)!r} holds no config.json: not a Hugging Face model folder")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None


def _files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    if (folder / INDEX).is_file():
        weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    if (folder / _SINGLE).is_file():
        entries, _ = read_header(folder / _SINGLE)
        return dict.fromkeys(entries, folder / _SINGLE)
    raise ValueError(f"{str(folder)!r} holds neither {INDEX} nor {_SINGLE}")


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(repr(n) for n in names[:_SHOWN]) + more


def _stored(entry: Entry, scheme: Scheme) -> list[str]:
    return [s.name for s in entry.specs(scheme)]


def _check_names(entries: list[Entry], files: dict[str, Path], scheme: Scheme) -> None:
    expected: set[str] = set()
    hp_in_ckpt, mx_in_ckpt, missing = [], [], []
    for e in entries:
        names = _stored(e, scheme)
        expected.update(names)
        module = e.name.removesuffix(".weight")
        scaled = f"{module}.{scheme.scale_name}" in files
        if e.config is not None and not scaled and e.name in files:
            hp_in_ckpt.append(module)
        elif e.config is None and e.name.endswith(".weight") and scaled:
            mx_in_ckpt.append(module)
        else:
            missing += [n for n in names if n not in files]
    if hp_in_ckpt:
        raise ValueError(
            f"load_pretrained: {_listed(hp_in_ckpt)} are MX in the model but stored in high "
            f"precision (the checkpoint's ignore list): leave them out of convert"
        )
    if mx_in_ckpt:
        raise ValueError(
            f"load_pretrained: {_listed(mx_in_ckpt)} are stored in {scheme.name} but high "
            f"precision in the model: convert them too (their codes would be lost)"
        )
    if missing:
        raise ValueError(f"load_pretrained: the checkpoint lacks {_listed(missing)}")
    extra = sorted(set(files) - expected)
    if extra:
        raise ValueError(f"load_pretrained: the checkpoint holds tensors the model has not: "
                         f"{_listed(extra)} (another model?)")  # fmt: skip


def _check_llama(model: nn.Module, config: dict) -> None:
    theirs = llama_names.mx_config(config)
    if theirs != model.config:
        raise ValueError(f"load_pretrained: config.json describes {theirs}, the model is "
                         f"{model.config}")  # fmt: skip


@torch.no_grad()
def load_pretrained(
    model: nn.Module,
    folder: str | os.PathLike,
    *,
    compute_dtype: torch.dtype | None = torch.bfloat16,
    preserve_codes: bool = True,
) -> nn.Module:
    """Load the compressed-tensors MX model in ``folder`` into ``model`` (in place).

    ``model`` is the MX model to train: mx-nn's Llama (the folder's Hugging Face Llama
    names are mapped back, RoPE rows reordered back) or a Hugging Face model, converted
    (``mx_nn.convert``) so that exactly the layers stored in MX are MXLinear, in the
    stored element format, before any parallelism.

    Args:
        model: the MX model (plain tensors, any device and dtype).
        folder: an export folder (config.json with a compressed-tensors MX
            ``quantization_config``, safetensors shards).
        compute_dtype: the dtype the training forward will cast the weights to before
            their MX cast (as in :func:`mx_nn.export.export`): the codes come back in it.
        preserve_codes: make each MX weight the tensor whose cast gives the stored codes
            back (module doc); False loads the exact dequantized values (the same
            values after the cast, on some blocks as other codes: doubled, with a scale
            one lower).

    Returns:
        ``model``.

    Raises:
        ValueError: no MX quantization_config; layers MX on one side and high precision
            on the other; missing, extra or differently shaped tensors; a mx-nn Llama of
            another config; DTensor parameters (load before parallelizing). These are
            found before anything is loaded. A block whose codes cannot be preserved
            raises after the tensors before it were loaded.
    """
    source = Path(folder)
    config = read_config(source)
    if "quantization_config" not in config:
        raise ValueError(f"{str(source)!r}: config.json has no quantization_config (not MX)")
    scheme = scheme_from_config(config["quantization_config"])
    compute_dtype = check_compute_dtype(compute_dtype)
    plan = plan_model(model, scheme, hf_config=config)
    if plan.llama:
        _check_llama(model, config)
    params = {clean_fqn(k): v for k, v in model.state_dict(keep_vars=True).items()}
    sharded = [k for k in params if isinstance(params[k], DTensor)]
    if sharded:
        raise ValueError(f"load_pretrained: {_listed(sharded)} are DTensors; load into the "
                         f"model before parallelizing it")  # fmt: skip
    files = _files(source)
    entries = list(plan.entries)
    _check_names(entries, files, scheme)
    headers = {p: read_header(p)[0] for p in set(files.values())}
    for e in entries:
        for spec in e.specs(scheme):
            got = headers[files[spec.name]][spec.name]["shape"]
            if tuple(got) != spec.shape:
                raise ValueError(f"load_pretrained: {spec.name!r} is stored with shape {got}, "
                                 f"the model needs {list(spec.shape)}")  # fmt: skip
    for e in entries:
        target = params[e.key]
        stored = [read_tensor(files[s.name], s.name) for s in e.specs(scheme)]
        if e.config is None:
            value = stored[0]
        else:
            value = weight_for(stored[0], stored[1], e.config, target.dtype, compute_dtype, e.key,
                               preserve_codes=preserve_codes)  # fmt: skip
        if e.rope_heads:
            rows = llama_names.rope_rows(e.rope_heads, value.shape[0] // e.rope_heads)
            value = value[torch.argsort(rows)]
        target.copy_(value)
    return model
