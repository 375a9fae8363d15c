"""``python -m mx_nn.export CHECKPOINT OUT``: an ``mx-train`` checkpoint (of any
``--tp``/``--dp``) as a Hugging Face model folder in compressed-tensors' MX format.
Exit status: 0 done, 1 failed (the message says why; nothing is written), 2 a bad flag."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mx_nn.export.hf_dir import DEFAULT_SHARD_BYTES
from mx_nn.export.schemes import SCHEMES
from mx_nn.train.export import export_run
from mx_nn.train.manifest import CheckpointError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mx_nn.export",
        description="Export an mx-train checkpoint as a Hugging Face model folder in "
        "compressed-tensors' MX format (the codes and scales the run trained with), which "
        "transformers loads and vLLM serves.",
    )
    p.add_argument("checkpoint", help="a checkpoint generation, the run's checkpoint "
                   "folder or its --out (the newest complete checkpoint there)")  # fmt: skip
    p.add_argument("out", help="a new or empty folder")
    p.add_argument("--scheme", choices=sorted(SCHEMES), default=None,
                   help="default: the one the run's recipe trains (mxfp8 recipes: mxfp8, "
                   "mxfp4: mxfp4)")  # fmt: skip
    p.add_argument("--max-shard-bytes", type=int, default=DEFAULT_SHARD_BYTES,
                   help="largest safetensors shard")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; its exit status."""
    ns = _parser().parse_args(argv)
    try:
        out, recipe, scheme = export_run(ns.checkpoint, ns.out, ns.scheme,
                                         max_shard_bytes=ns.max_shard_bytes)  # fmt: skip
    except (ValueError, TypeError, OSError, CheckpointError) as e:
        print(f"python -m mx_nn.export: error: {e}", file=sys.stderr)
        return 1
    print(f"exported the {recipe} run as {scheme.name} ({scheme.format}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
