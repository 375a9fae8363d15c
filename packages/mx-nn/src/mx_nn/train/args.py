"""Command-line flags of ``mx-train`` and the frozen :class:`TrainArgs` they make."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mx_nn.config import MXRecipe
from mx_nn.llama import LlamaConfig

__all__ = ["BF16", "TrainArgs", "build_parser", "parse_args"]

BF16 = "bf16"
"""The baseline recipe name: every linear in bf16 (autocast), no MX cast."""
RECIPES = (BF16, *(r.value for r in MXRecipe))
_BLOCK = 32  # MX block: every MX linear's in/out features are multiples of it


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
    """Continue from the checkpoint in ``out``."""
    seed: int = 0
    """Seeds the init and the batch order."""
    autocast: bool = True
    """Compute under bf16 autocast (fp32 weights and optimizer); off: everything in fp32."""

    @property
    def runs(self) -> tuple[str, ...]:
        """Recipes trained, in order: ``("bf16", recipe)`` with compare, else ``(recipe,)``."""
        return (BF16, self.recipe) if self.compare else (self.recipe,)

    @property
    def model_config(self) -> LlamaConfig:
        """The Llama these flags describe (SwiGLU hidden width 8/3 dim, rounded up to 128)."""
        hidden = 128 * math.ceil(8 * self.dim / 3 / 128)
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
    """The ``mx-train`` argument parser."""
    d = TrainArgs()
    p = argparse.ArgumentParser(
        prog="mx-train",
        description="Train a small Llama on bytes in an MX recipe beside bf16, then report "
        "losses, speed, memory and per-layer SQNR (figures and JSON in --out).",
        formatter_class=_HelpFormatter,
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
    p.add_argument("--resume", action="store_true", help="continue from --out's checkpoint")
    p.add_argument("--seed", type=_typed(int, "a non-negative integer", 0), default=d.seed,
                   help="seed of init and batches")  # fmt: skip
    return p


def parse_args(argv: Sequence[str] | None = None) -> TrainArgs:
    """Parse ``argv`` (default ``sys.argv[1:]``); a bad value exits with an argparse error
    naming the flag (exit status 2)."""
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
    if ns.resume and not (Path(ns.out) / "checkpoint").is_dir():
        parser.error(f"argument --resume: no checkpoint in --out {ns.out!r}")
    return TrainArgs(**{k.replace("-", "_"): v for k, v in vars(ns).items()})


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
