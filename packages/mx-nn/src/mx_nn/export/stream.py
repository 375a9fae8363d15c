"""The export loop shared by a live model and a DCP checkpoint: each tensor of a plan is
fetched alone (gathered, when sharded), turned into what the checkpoint stores (rows
reordered for RoPE, an MX layer's weight cast as in training) and written, so no
process ever holds more than one tensor of the model beyond what it had.

Under a process group every rank fetches (a sharded tensor's gather is a collective)
and only rank 0 casts and writes; an error there (a full disk, a weight that is not
finite) stops its writing but not its part in the gathers, and reaches every rank at
the end.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from mx_nn.export import llama_names
from mx_nn.export.hf_dir import DirWriter
from mx_nn.export.plan import Entry, ExportPlan
from mx_nn.export.schemes import Scheme
from mx_nn.export.weights import weight_codes

__all__ = ["agree", "is_main", "stored_tensors", "write_plan"]

Fetch = Callable[[Entry], torch.Tensor | None]
"""The whole tensor of an entry (None on ranks that do not write)."""


def is_main() -> bool:
    """Whether this process writes.

    Returns:
        True on rank 0, or without a process group.
    """
    return not dist.is_initialized() or dist.get_rank() == 0


def agree(error: BaseException | None) -> None:
    """Raise on every rank what rank 0 hit. Every rank of a process group calls it (a
    broadcast).

    Args:
        error: this rank's exception, or None (only rank 0's counts elsewhere).
    Raises:
        Exception: rank 0's own exception there; elsewhere the same type with rank 0's
            message (``"rank 0: ..."``), RuntimeError for types other than ValueError,
            TypeError and OSError. Without a process group, ``error`` itself.
    """
    if dist.is_initialized():
        shared = [None if error is None else (type(error).__name__, str(error))]
        dist.broadcast_object_list(shared, src=0)
        if error is None and shared[0] is not None:
            kind, message = shared[0]
            types = {"ValueError": ValueError, "TypeError": TypeError, "OSError": OSError}
            raise types.get(kind, RuntimeError)(f"rank 0: {message}")
    if error is not None:
        raise error


def stored_tensors(
    entry: Entry, tensor: torch.Tensor, scheme: Scheme, compute_dtype: torch.dtype | None
) -> list[torch.Tensor]:
    """What the checkpoint holds of one entry.

    Args:
        entry: the plan's entry.
        tensor: its whole value (any device).
        scheme: the export's scheme.
        compute_dtype: as :func:`~mx_nn.export.weights.weight_codes`.
    Returns:
        The tensors in the order of ``entry.specs(scheme)``: ``[tensor]`` (rows
        reordered for RoPE where ``entry.rope_heads``), or an MX weight's codes and
        uint8 scale bytes.
    Raises:
        ValueError: as :func:`~mx_nn.export.weights.weight_codes`.
    """
    if entry.rope_heads:
        rows = llama_names.rope_rows(entry.rope_heads, tensor.shape[0] // entry.rope_heads)
        tensor = tensor[rows.to(tensor.device)]
    if entry.config is None:
        return [tensor]
    return list(weight_codes(tensor, entry.config, compute_dtype, entry.key))


def write_plan(
    plan: ExportPlan,
    scheme: Scheme,
    out_dir: Path,
    fetch: Fetch,
    *,
    compute_dtype: torch.dtype | None,
    config: dict,
    extras: list[Callable[[Path], None]],
    max_shard_bytes: int,
) -> None:
    """Write ``plan`` to ``out_dir`` (rank 0), fetching every entry on every rank.

    Args:
        plan: what to write (:func:`~mx_nn.export.plan.plan_model`).
        scheme: the export's scheme.
        out_dir: the folder (new or empty; written beside it, then moved in place).
        fetch: an entry's whole tensor (None on ranks that do not write), called for
            every entry in order on every rank.
        compute_dtype: as :func:`~mx_nn.export.weights.weight_codes`.
        config: config.json's dict.
        extras: functions of the folder that add files (tokenizer, generation config).
        max_shard_bytes: the largest safetensors shard, in bytes.
    Raises:
        OSError, ValueError: on every rank, what rank 0 hit (:func:`agree`); the
            folder is then not written.
    """
    groups = [e.specs(scheme) for e in plan.entries]
    writer, error = None, None
    if is_main():
        try:
            writer = DirWriter(out_dir, groups, max_shard_bytes)
        except OSError as e:
            error = e
    for entry in plan.entries:
        tensor = fetch(entry)  # every rank: a gather is a collective
        if writer is None or error is not None or tensor is None:
            continue
        try:
            writer.write(stored_tensors(entry, tensor, scheme, compute_dtype))
        except Exception as e:  # kept for every rank (agree), which raises it
            error = e
        del tensor
    if writer is not None and error is None:
        try:
            writer.finish(config, extras)
        except Exception as e:
            error = e
    if writer is not None and error is not None:
        writer.abort()
    agree(error)
