"""Command-line flags of ``mx-train`` and the frozen :class:`TrainArgs` they make."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mx_nn.config import MXRecipe
from mx_nn.export.hf_dir import check_out_dir
from mx_nn.export.schemes import scheme_for_recipe
from mx_nn.models.llama import LlamaConfig
from mx_nn.train import budget, checkpoint

__all__ = ["BF16", "SAVE_EVERY", "TrainArgs", "build_parser", "parse_args"]

BF16 = "bf16"
"""The baseline recipe name: every linear in bf16 (autocast), no MX cast."""
RECIPES = (BF16, *(r.value for r in MXRecipe))
_BLOCK = 32  # MX block: every MX linear's in/out features are multiples of it
SAVE_EVERY = 100
"""Default ``--save-every``: a checkpoint of the default model takes well under a
second, 100 steps of it tens of seconds on a CPU."""


def ffn_width(dim: int) -> int:
    """The SwiGLU hidden width of a model of width ``dim``: 8/3 dim, rounded up to 128."""
    return 128 * math.ceil(8 * dim / 3 / 128)


@dataclass(frozen=True, kw_only=True)
class TrainArgs:
    """What one ``mx-train`` invocation does (defaults: the no-argument run)."""

    recipe: str = "mxfp8"
    """An mx_nn recipe name, or ``"bf16"``."""
    compare: bool = True
    """Also train a bf16 baseline first, with the same seed, init and batches."""
    steps: int = 300
    """Optimizer steps per run."""
    batch: int = 16
    """Sequences per optimizer step, global: each of the ``dp`` ranks takes a contiguous
    ``batch / dp`` of them, so any ``dp`` trains on the same batches."""
    seq: int = 128
    """Tokens (bytes) per sequence."""
    layers: int = 2
    """Transformer blocks."""
    dim: int = 128
    """Model width."""
    heads: int = 4
    """Query heads."""
    kv_heads: int = 2
    """Key/value heads."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warmup, cosine decay to a tenth)."""
    tp: int = 1
    """Tensor-parallel degree."""
    dp: int = 1
    """Data-parallel degree (FSDP2: parameters, gradients and optimizer state sharded)."""
    device: str = "cpu"
    """torch device string the run uses."""
    compile: bool = False
    """Wrap the model in ``torch.compile``."""
    data: str | None = None
    """A UTF-8 text file to train on instead of the built-in corpus."""
    out: str = "mx-train-out"
    """Folder for the checkpoint, figures, JSON and log."""
    resume: bool = False
    """Continue from the newest complete checkpoint in ``out``."""
    overwrite: bool = False
    """Start afresh in an ``out`` that holds a checkpoint (replaced once the new run's
    first checkpoint is complete)."""
    save_every: int = SAVE_EVERY
    """Also checkpoint every this many steps of a run (0: only at its end and when
    stopped), so that a kill -9 loses at most that many steps."""
    seed: int = 0
    """Seeds the init and the batch order."""
    autocast: bool = True
    """Compute under bf16 autocast (fp32 weights and optimizer); off: everything in fp32."""
    export: str | None = None
    """A new or empty folder to write the final model to as a Hugging Face model in
    compressed-tensors' MX format (:mod:`mx_nn.export`), once the run completes."""

    @property
    def runs(self) -> tuple[str, ...]:
        """Recipes trained, in order: ``("bf16", recipe)`` with compare, else ``(recipe,)``."""
        return (BF16, self.recipe) if self.compare else (self.recipe,)

    @property
    def model_config(self) -> LlamaConfig:
        """The Llama these flags describe (FFN width: :func:`ffn_width`)."""
        hidden = ffn_width(self.dim)
        return LlamaConfig(dim=self.dim, n_layers=self.layers, n_heads=self.heads,
                           n_kv_heads=self.kv_heads, hidden_dim=hidden,
                           max_seq_len=self.seq)  # fmt: skip

    def to_dict(self) -> dict:
        """Every field, JSON-ready."""
        return asdict(self)


def _typed(kind: type, name: str, minimum: float | None = None, exclusive: bool = False):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {name}") from None
        if minimum is not None and (value <= minimum if exclusive else value < minimum):
            raise argparse.ArgumentTypeError(f"{text!r} is not {name}")
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {name}")
        return value

    parse.__name__ = name
    return parse


_POS_INT = _typed(int, "a positive integer", 1)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    # Flags whose default is None say in their help what None means.
    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The ``mx-train`` argument parser.

    Returns:
        A fresh ``argparse.ArgumentParser`` with every flag, defaults from
        :class:`TrainArgs`; it parses without the checks of :func:`parse_args`.
    """
    d = TrainArgs()
    p = argparse.ArgumentParser(
        prog="mx-train",
        description="Train a small Llama on bytes in an MX recipe beside bf16, then report "
        "losses, speed, memory and per-layer SQNR (figures and JSON in --out).",
        formatter_class=_HelpFormatter,
        epilog="exit status: 0 done; 1 failed (the message says why and what is kept: a "
        "checkpoint that cannot be written or is corrupt, an unwritable report); 2 a bad "
        "flag; 3 a non-finite loss or gradient; 130 stopped by SIGINT or SIGTERM, with a "
        "complete checkpoint",
    )
    p.add_argument("--recipe", choices=RECIPES, default=d.recipe, help="recipe to train")
    p.add_argument("--compare", action=argparse.BooleanOptionalAction, default=None,
                   help="also train bf16 with the same seed, init and batches "
                   "(default: on unless --recipe bf16)")  # fmt: skip
    p.add_argument("--steps", type=_POS_INT, default=d.steps, help="optimizer steps per run")
    p.add_argument("--batch", type=_POS_INT, default=d.batch,
                   help="sequences per step, global: the --dp ranks take --batch / --dp "
                   "each, so the batches (and losses) do not depend on --dp")  # fmt: skip
    p.add_argument("--seq", type=_POS_INT, default=d.seq, help="tokens (bytes) per sequence")
    p.add_argument("--layers", type=_POS_INT, default=d.layers, help="transformer blocks")
    p.add_argument("--dim", type=_POS_INT, default=d.dim, help="model width")
    p.add_argument("--heads", type=_POS_INT, default=d.heads, help="query heads")
    p.add_argument("--kv-heads", type=_POS_INT, default=d.kv_heads, help="key/value heads")
    p.add_argument("--lr", type=_typed(float, "a positive number", 0.0, exclusive=True),
                   default=d.lr, help="peak learning rate")  # fmt: skip
    p.add_argument("--tp", type=_POS_INT, default=d.tp,
                   help="tensor-parallel degree (torchrun: --tp x --dp processes)")  # fmt: skip
    p.add_argument("--dp", type=_POS_INT, default=d.dp,
                   help="data-parallel degree: FSDP2 over --dp ranks, each computing its "
                   "share of --batch and of the held-out set; the losses reported are "
                   "the global means (under torchrun: --tp x --dp processes)")  # fmt: skip
    p.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument(
        "--data",
        metavar="PATH",
        default=None,
        help="UTF-8 text file to train on (default: the built-in Shakespeare corpus)",
    )
    p.add_argument("--out", metavar="DIR", default=d.out, help="output folder")
    p.add_argument("--autocast", action=argparse.BooleanOptionalAction, default=d.autocast,
                   help="compute under bf16 autocast; --no-autocast computes in fp32")  # fmt: skip
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in --out (verified "
                   "against its manifest; a corrupt one is refused)")  # fmt: skip
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run in an --out that holds a checkpoint (without "
                   "--resume or --overwrite that is refused); the old checkpoint stays "
                   "until the new run's first one is complete")  # fmt: skip
    p.add_argument("--save-every", metavar="N", type=_typed(int, "a non-negative integer", 0),
                   default=d.save_every,
                   help="also checkpoint every N steps of a run, so a kill -9 or an OOM "
                   "loses at most N steps (0: only at the end of each run and when "
                   "stopped)")  # fmt: skip
    p.add_argument("--seed", type=_typed(int, "a non-negative integer", 0), default=d.seed,
                   help="seed of init and batches")  # fmt: skip
    p.add_argument("--export", metavar="DIR", default=None,
                   help="when the run completes, write the final model to DIR (new or empty) "
                   "as a Hugging Face model in compressed-tensors' MX format (mxfp8 or "
                   "mxfp4, as the recipe trains), the exact codes it trained with")  # fmt: skip
    return p


def parse_args(argv: Sequence[str] | None = None) -> TrainArgs:
    """Parse and check ``mx-train``'s command line.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).
    Returns:
        The :class:`TrainArgs` (the device resolved: ``cuda`` where available, else
        ``cpu``).
    Raises:
        SystemExit: a bad value, a combination that cannot run or a step that would not
            fit in memory: an argparse error naming the flag (exit status 2).
    """
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.compare is None:
        ns.compare = ns.recipe != BF16
    elif ns.compare and ns.recipe == BF16:
        parser.error("argument --compare: needs an MX --recipe (bf16 is the baseline itself)")
    if ns.dim % ns.heads:
        parser.error(f"argument --heads: --dim {ns.dim} is not divisible by --heads {ns.heads}")
    if ns.heads % ns.kv_heads:
        parser.error(
            f"argument --kv-heads: --heads {ns.heads} is not divisible by --kv-heads {ns.kv_heads}"
        )
    if (ns.dim // ns.heads) % 2:
        parser.error(f"argument --heads: head width --dim / --heads = {ns.dim / ns.heads:g} "
                     "must be even (RoPE rotates pairs)")  # fmt: skip
    if ns.recipe != BF16:
        kv_width = ns.kv_heads * (ns.dim // ns.heads)
        if ns.dim % _BLOCK or kv_width % _BLOCK:
            parser.error(f"argument --dim: MX linears need --dim ({ns.dim}) and --kv-heads x "
                         f"head width ({kv_width}) to be multiples of {_BLOCK}")  # fmt: skip
    if ns.batch % ns.dp:
        parser.error(f"argument --dp: --batch {ns.batch} is not divisible by --dp {ns.dp}")
    if ns.heads % ns.tp or ns.kv_heads % ns.tp:
        parser.error(f"argument --tp: --heads {ns.heads} and --kv-heads {ns.kv_heads} must be "
                     f"divisible by --tp {ns.tp}")  # fmt: skip
    ns.device = _device(parser, ns.device)
    if ns.data is not None and not Path(ns.data).is_file():
        parser.error(f"argument --data: {ns.data!r} is not a file")
    if ns.data is not None and Path(ns.data).stat().st_size == 0:
        parser.error(f"argument --data: {ns.data!r} is empty")
    _check_out(parser, ns)
    _check_export(parser, ns)
    _check_memory(parser, ns)
    return TrainArgs(**{k.replace("-", "_"): v for k, v in vars(ns).items()})


def _check_out(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    out = Path(ns.out)
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not existing.is_dir():
        where = "" if existing == out else f" (it would be inside the file {str(existing)!r})"
        parser.error(f"argument --out: {ns.out!r} is not a folder{where}")
    if ns.resume and ns.overwrite:
        parser.error("argument --overwrite: not with --resume (continue the run in --out, "
                     "or start afresh over it: one of the two)")  # fmt: skip
    root = out / "checkpoint"
    newest = checkpoint.latest(root)
    if ns.resume and newest is None:
        left = " (only incomplete ones: a save was cut short before any completed, or an " \
            "older mx-train wrote them; start afresh with --overwrite)" \
            if root.is_dir() and any(root.iterdir()) else ""  # fmt: skip
        parser.error(f"argument --resume: no checkpoint in --out {ns.out!r}{left}")
    if not ns.resume and not ns.overwrite and root.is_dir() and any(root.iterdir()):
        what = f"the checkpoint {newest.name}" if newest else "incomplete checkpoints"
        parser.error(f"argument --out: {ns.out!r} holds {what} of an earlier run; continue "
                     "it with --resume, or start afresh over it with --overwrite")  # fmt: skip


def _check_export(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if ns.export is None:
        return
    if ns.recipe == BF16:
        parser.error("argument --export: needs an MX --recipe (the bf16 baseline has no MX "
                     "codes to serve)")  # fmt: skip
    try:
        scheme_for_recipe(ns.recipe)
    except ValueError as e:
        parser.error(f"argument --export: {e}")
    try:
        check_out_dir(ns.export)
    except ValueError as e:
        parser.error(f"argument --export: {e}")


def _check_memory(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    device = torch.device(ns.device)
    hidden = ffn_width(ns.dim)
    # On CUDA each rank has a device of its own; CPU ranks share the host's memory.
    cuda = device.type == "cuda"
    tokens = (ns.batch // ns.dp if cuda else ns.batch) * ns.seq
    tp = ns.tp if cuda else 1
    need = budget.step_bytes(dim=ns.dim, hidden=hidden, layers=ns.layers, tokens=tokens, tp=tp)
    have, kind = budget.available_bytes(device)
    if need > have:
        per = budget.per_token_bytes(ns.dim, hidden, ns.layers, tp)
        parser.error(f"argument --seq: --batch {ns.batch} x --seq {ns.seq} needs at least "
                     f"{need / 2**30:.1f} GiB for one training step's activations (about "
                     f"{per / 1024:.0f} KiB a token at --layers {ns.layers} --dim {ns.dim}), "
                     f"more than the {have / 2**30:.1f} GiB of {kind} here: lower --seq or "
                     "--batch")  # fmt: skip


def _device(parser: argparse.ArgumentParser, text: str | None) -> str:
    if text is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError:
        parser.error(f"argument --device: {text!r} is not a torch device (e.g. cpu, cuda:0)")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"argument --device: {text!r}: only cpu and cuda devices are supported")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"argument --device: {text!r}, but CUDA is not available here")
    return str(device)
