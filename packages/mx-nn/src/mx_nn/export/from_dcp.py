"""Export from a ``torch.distributed.checkpoint`` (DCP) folder of any TP/FSDP layout, in
one process: each tensor is read alone, its shards put together by DCP's planner (only
the byte ranges of that tensor are read), turned into what the export stores and
written before the next one is read. So the process holds one tensor of the model at a
time, never the whole model.

The model's structure (which layers are MX, with which config) comes from a skeleton:
the same model class built on the meta device and converted as in training. The
checkpoint gives every tensor's shape and dtype; both must match the skeleton's keys.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from mx_nn.export.api import check_shard_bytes
from mx_nn.export.hf_dir import DEFAULT_SHARD_BYTES, check_out_dir
from mx_nn.export.plan import Entry, plan_model
from mx_nn.export.schemes import Scheme, get_scheme
from mx_nn.export.stream import write_plan
from mx_nn.export.weights import check_compute_dtype

__all__ = ["export_checkpoint", "read_tensor"]


def _metadata(checkpoint: Path) -> dict[str, TensorStorageMetadata]:
    if not (checkpoint / ".metadata").is_file():
        raise ValueError(
            f"checkpoint {str(checkpoint)!r} is not a torch.distributed.checkpoint folder "
            f"(no .metadata)"
        )
    meta = dcp.FileSystemReader(str(checkpoint)).read_metadata()
    return {k: v for k, v in meta.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata)}  # fmt: skip


def read_tensor(checkpoint: Path, key: str, meta: TensorStorageMetadata) -> torch.Tensor:
    """One tensor of a DCP folder, whole, read alone (only its byte ranges).

    Args:
        checkpoint: the DCP folder.
        key: the tensor's key in the checkpoint.
        meta: its metadata there (global size, dtype).
    Returns:
        The tensor, on the CPU, of the checkpoint's size and dtype.
    """
    out = {key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)}
    with warnings.catch_warnings():  # "assumes the intent is to load in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(out, storage_reader=dcp.FileSystemReader(str(checkpoint)), no_dist=True)
    return out[key]


def export_checkpoint(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    model: nn.Module,
    scheme: str | Scheme,
    *,
    key_prefix: str = "model.",
    compute_dtype: torch.dtype | None = torch.bfloat16,
    hf_config: object = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """:func:`mx_nn.export.export` of the weights in a DCP checkpoint, one tensor at a
    time (module doc). One process; no process group needed.

    Args:
        checkpoint: the DCP folder (it holds ``.metadata``).
        out_dir: a new or empty folder.
        model: the skeleton: the trained model's class, converted as in training
            (``mx_nn.convert`` with the same recipe and filter); build it under
            ``torch.device("meta")``, since its values are never read.
        scheme: ``"mxfp8"`` or ``"mxfp4"``.
        key_prefix: what the checkpoint's keys put before the model's state-dict keys
            (``"model."`` for a checkpoint saved as ``{"model": model_state, ...}``, as
            ``mx-train`` and torchtitan save it).
        compute_dtype, hf_config, max_shard_bytes: as :func:`mx_nn.export.export`.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: ``checkpoint`` is no DCP folder, or lacks a key of the skeleton or
            holds it with another shape; the errors of :func:`mx_nn.export.export`.
            Nothing is written then.
        OSError: a read or write failed (nothing is left in ``out_dir``).
    """
    scheme = get_scheme(scheme)
    plan = plan_model(model, scheme, hf_config)
    compute_dtype = check_compute_dtype(compute_dtype)
    max_shard_bytes = check_shard_bytes(max_shard_bytes)
    path = check_out_dir(out_dir)
    source = Path(checkpoint)
    meta = _metadata(source)
    missing = [e.key for e in plan.entries if key_prefix + e.key not in meta]
    if missing:
        raise ValueError(
            f"checkpoint {str(source)!r} lacks {len(missing)} tensor(s) of the model under "
            f"prefix {key_prefix!r}: {missing[:4]} (it holds e.g. {sorted(meta)[:3]})"
        )
    entries = []
    for e in plan.entries:
        m = meta[key_prefix + e.key]
        if tuple(m.size) != e.shape:
            raise ValueError(
                f"checkpoint {str(source)!r}: {e.key!r} has shape {list(m.size)}, the model "
                f"{list(e.shape)}: not this model's checkpoint"
            )
        entries.append(Entry(key=e.key, name=e.name, shape=e.shape, dtype=m.properties.dtype,
                             config=e.config, rope_heads=e.rope_heads))  # fmt: skip
    plan = dataclasses.replace(plan, entries=tuple(entries))
    config = {
        **plan.hf_config,
        "quantization_config": scheme.quantization_config(list(plan.ignore)),
    }

    def fetch(entry: Entry) -> torch.Tensor:
        return read_tensor(source, key_prefix + entry.key, meta[key_prefix + entry.key])

    write_plan(plan, scheme, path, fetch, compute_dtype=compute_dtype, config=config,
               extras=[], max_shard_bytes=max_shard_bytes)  # fmt: skip
    return path
