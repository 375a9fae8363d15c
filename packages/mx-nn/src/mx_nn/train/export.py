"""Serving export of an ``mx-train`` run: from a checkpoint (``python -m mx_nn.export``),
rebuilding the model from the run's flags, or from the live model at the end of a run
(``mx-train --export DIR``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from torch import nn

from mx_nn.convert import convert
from mx_nn.export.api import export
from mx_nn.export.from_dcp import export_checkpoint
from mx_nn.export.schemes import Scheme, get_scheme, scheme_for_recipe
from mx_nn.models.llama import Llama
from mx_nn.train import checkpoint
from mx_nn.train.args import BF16, TrainArgs
from mx_nn.train.loop import mx_filter

__all__ = ["compute_dtype", "export_live", "export_run", "generation_of"]


def compute_dtype(args: TrainArgs) -> torch.dtype:
    """The dtype the run's forward cast its weights to before the MX casts.

    Args:
        args: the run's flags.
    Returns:
        bf16 under ``--autocast`` (the default), else fp32.
    """
    return torch.bfloat16 if args.autocast else torch.float32


def generation_of(path: str | os.PathLike) -> Path:
    """The checkpoint generation ``path`` names: a generation folder itself, or the newest
    complete one under ``path`` (the ``checkpoint`` folder of a run, or the run's
    ``--out``), verified against its manifest.

    Args:
        path: a generation folder, a run's checkpoint folder, or its ``--out``.
    Returns:
        The verified generation's folder.
    Raises:
        ValueError: no mx-train checkpoint there.
        CheckpointError: the newest one is corrupt (its files and their digests named).
    """
    p = Path(path)
    if (p / ".metadata").is_file() and (p / "loop-rank0.pt").is_file():
        checkpoint.verify(p)
        return p
    root = p / "checkpoint" if (p / "checkpoint").is_dir() else p
    if checkpoint.latest(root) is None:
        raise ValueError(
            f"{str(p)!r} holds no complete mx-train checkpoint (a generation folder, the "
            f"run's checkpoint folder, or its --out)"
        )
    return checkpoint.find(root)


def _args_of(saved: dict) -> TrainArgs:
    # Flags added since the checkpoint was written keep their defaults.
    names = {f.name for f in dataclasses.fields(TrainArgs)}
    return TrainArgs(**{k: v for k, v in saved.items() if k in names})


def _skeleton(args: TrainArgs, recipe: str) -> nn.Module:
    with torch.device("meta"):
        model = Llama(args.model_config)
    return convert(model, recipe, filter_fn=mx_filter)


def export_run(
    path: str | os.PathLike, out_dir: str | os.PathLike, scheme: str | None = None, **kwargs
) -> tuple[Path, str, Scheme]:
    """Export the model of the mx-train checkpoint at ``path`` to ``out_dir`` (one
    process, one tensor at a time, whatever ``--tp``/``--dp`` wrote it).

    Args:
        path: see :func:`generation_of`.
        out_dir: a new or empty folder.
        scheme: ``"mxfp8"``/``"mxfp4"``; default: the one the run's recipe trains.
        kwargs: ``max_shard_bytes``.

    Returns:
        (the folder, the recipe, the scheme).

    Raises:
        ValueError: no checkpoint; one of the bf16 baseline (no MX layer) or of a
            recipe whose weights neither layout stores; the errors of
            :func:`mx_nn.export.export_checkpoint`.
        CheckpointError: a corrupt checkpoint.
    """
    gen = generation_of(path)
    loop = checkpoint.load_loop(gen)
    args = _args_of(loop["args"])
    recipe = args.runs[loop["run_index"]]
    if recipe == BF16:
        raise ValueError(
            f"checkpoint {gen} holds the bf16 baseline run: it has no MX layer to export "
            f"(the {args.recipe} run's checkpoint replaces it once that run saves)"
        )
    chosen = scheme_for_recipe(recipe) if scheme is None else get_scheme(scheme)
    out = export_checkpoint(gen, out_dir, _skeleton(args, recipe), chosen,
                            compute_dtype=compute_dtype(args), **kwargs)  # fmt: skip
    return out, recipe, chosen


def export_live(model: nn.Module, args: TrainArgs) -> tuple[Path, Scheme]:
    """``mx-train --export``: the run's final model to ``args.export``.

    Args:
        model: the run's final model (sharded under torchrun; every rank calls this).
        args: the run's flags (an MX ``--recipe``, ``--export`` set).
    Returns:
        ``(folder, scheme)``: the export folder and the scheme of the recipe's weights.
    Raises:
        ValueError, OSError: as :func:`mx_nn.export.export`.
    """
    scheme = scheme_for_recipe(args.recipe)
    return export(model, args.export, scheme, compute_dtype=compute_dtype(args)), scheme
