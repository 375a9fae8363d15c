"""``export(model, out_dir, scheme)``: a trained MX model as a Hugging Face model folder
in compressed-tensors' MX layout (:mod:`mx_nn.export.schemes`), from one process or
from a live ``mx_nn.parallelize``-d model under a process group."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from mx_nn.export.hf_dir import (
    DEFAULT_SHARD_BYTES,
    check_out_dir,
    copy_tokenizer_files,
    saved_by,
)
from mx_nn.export.plan import Entry, clean_fqn, plan_model
from mx_nn.export.schemes import Scheme, get_scheme
from mx_nn.export.stream import agree, is_main, write_plan
from mx_nn.export.weights import check_compute_dtype

__all__ = ["check_shard_bytes", "export", "out_dir_agreed"]


def check_shard_bytes(max_shard_bytes: object) -> int:
    """Check the export's largest shard size.

    Args:
        max_shard_bytes: the value given.
    Returns:
        ``max_shard_bytes`` (bytes), a positive int.
    Raises:
        ValueError: anything else.
    """
    if (
        isinstance(max_shard_bytes, bool)
        or not isinstance(max_shard_bytes, int)
        or (max_shard_bytes <= 0)
    ):
        raise ValueError(f"max_shard_bytes={max_shard_bytes!r} must be a positive int")
    return max_shard_bytes


def out_dir_agreed(out_dir: object) -> Path:
    """:func:`~mx_nn.export.hf_dir.check_out_dir` on rank 0, its verdict on every rank.

    Args:
        out_dir: the export's folder, as given. Every rank of a process group calls this.
    Returns:
        ``out_dir`` as a Path.
    Raises:
        TypeError, ValueError: rank 0's refusal, on every rank (:func:`~mx_nn.export.stream.agree`).
    """
    path, error = None, None
    if is_main():
        try:
            path = check_out_dir(out_dir)
        except (TypeError, ValueError) as e:
            error = e
    agree(error)
    return path if path is not None else Path(os.fspath(out_dir))  # type: ignore[arg-type]


def _own_folder(model: nn.Module) -> Path | None:
    """The local folder a Hugging Face model was loaded from, if any."""
    name = getattr(getattr(model, "config", None), "_name_or_path", None) or getattr(
        model, "name_or_path", None
    )
    return Path(name) if isinstance(name, str) and name and Path(name).is_dir() else None


def _extras(model: nn.Module, generation_config: object, tokenizer: object) -> list:
    extras: list[Callable[[Path], None]] = []
    generation = generation_config
    if generation is None:
        generation = getattr(model, "generation_config", None)
    if generation is not None:
        extras.append(saved_by(generation, "generation_config"))
    if tokenizer is None:
        folder = _own_folder(model)
        copy = copy_tokenizer_files(folder) if folder is not None else None
        if copy is not None:
            extras.append(copy)
    elif isinstance(tokenizer, str | os.PathLike):
        copy = copy_tokenizer_files(Path(tokenizer))
        if copy is None:
            raise ValueError(f"tokenizer={str(tokenizer)!r} holds no tokenizer files")
        extras.append(copy)
    else:
        extras.append(saved_by(tokenizer, "tokenizer"))
    return extras


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {clean_fqn(k): v for k, v in model.state_dict(keep_vars=True).items()}


def export(
    model: nn.Module,
    out_dir: str | os.PathLike,
    scheme: str | Scheme,
    *,
    compute_dtype: torch.dtype | None = torch.bfloat16,
    hf_config: object = None,
    generation_config: object = None,
    tokenizer: object = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Write ``model`` to ``out_dir`` as a Hugging Face model folder that
    ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)`` loads with
    compressed-tensors installed (and vLLM serves).

    Each MXLinear's weight is stored as the codes and E8M0 scales of the cast its
    training forward made (its config's format, block size and scale mode, after the
    cast to ``compute_dtype``), bit for bit: ``weight`` float8_e4m3fn [out, in]
    (``"mxfp8"``) or ``weight_packed`` uint8 [out, in / 2] (``"mxfp4"``), and
    ``weight_scale`` uint8 [out, in / 32]. Everything else (embeddings, norms, the
    head, linears left in high precision) is stored as it is, and the high-precision
    linears and embeddings are listed in ``ignore``. mx-nn's own Llama is written under
    Hugging Face Llama names with a ``LlamaConfig``; a Hugging Face model keeps its
    names and config (dtype set to bfloat16, the dtype the MX weights decompress to).

    Under a process group (a live ``mx_nn.parallelize``-d model) every rank must call
    it: each sharded tensor is gathered in turn, one at a time, and rank 0 writes.

    Args:
        model: a model with MXLinear layers (``mx_nn.convert``), on any device; its
            parameters may be DTensors (tensor parallel, FSDP2).
        out_dir: a new or empty folder (parents are created).
        scheme: ``"mxfp8"`` (e4m3 weights) or ``"mxfp4"`` (e2m1), the format the MX
            layers were trained in.
        compute_dtype: the dtype the training forward cast each weight to before its
            MX cast: the autocast dtype (bf16 for ``mx-train``'s default), float32 for a
            run without autocast, None for the weight's own dtype.
        hf_config: the Hugging Face config to write (a dict or an object with
            ``to_dict()``); default: the model's own (see above).
        generation_config: an object with ``save_pretrained`` (default: the model's
            ``generation_config``, if it has one).
        tokenizer: a tokenizer (``save_pretrained``) or a folder to copy tokenizer files
            from (default: those of the folder the model was loaded from, if any).
        max_shard_bytes: largest safetensors shard (a tensor larger gets its own).

    Returns:
        ``out_dir`` as a Path (on every rank).

    Raises:
        TypeError: ``model`` not a module; a ``tokenizer`` or ``generation_config``
            without ``save_pretrained``.
        ValueError: no MXLinear in the model; a scheme other than the format the layers
            were trained in; block size not 32; an MX weight tied to another tensor or
            holding NaN/inf; an ``out_dir`` that is a file or not empty. Nothing is
            written then.
        OSError: a write failed (nothing is left in ``out_dir``).
    """
    scheme = get_scheme(scheme)
    plan = plan_model(model, scheme, hf_config)
    compute_dtype = check_compute_dtype(compute_dtype)
    max_shard_bytes = check_shard_bytes(max_shard_bytes)
    extras = _extras(model, generation_config, tokenizer)
    config = {
        **plan.hf_config,
        "quantization_config": scheme.quantization_config(list(plan.ignore)),
    }
    path = out_dir_agreed(out_dir)
    state = _state(model)
    main = is_main()

    def fetch(entry: Entry) -> torch.Tensor | None:
        t = state[entry.key].detach()
        if isinstance(t, DTensor):
            t = t.full_tensor()  # a collective: every rank, in the plan's order
        return t if main else None

    write_plan(plan, scheme, path, fetch, compute_dtype=compute_dtype, config=config,
               extras=extras if main else [], max_shard_bytes=max_shard_bytes)  # fmt: skip
    if dist.is_initialized():
        dist.barrier()  # the folder is complete before any rank goes on
    return path
