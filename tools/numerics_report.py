"""The numerics report: what each MX format and scale mode does to typical data.

Until ``mx-train`` exists this is the project's main job (README's first command). For
every format and scale mode it prints the round-trip SQNR on N(0, 1) data and on
heavy-tailed (Student-t, 3 dof) data, and checks the semantics table.

Usage: python tools/numerics_report.py [--rows 512] [--cols 4096] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

import mx_core
from mx_core.elements import decode
from mx_core.testing import SEMANTIC_CASES, semantic_block, sqnr_db


def semantics_failures() -> list[str]:
    failures = []
    for case in SEMANTIC_CASES:
        for mode, (exponent, element) in case.expected.items():
            t = mx_core.quantize(semantic_block(case)[None], case.fmt, scale_mode=mode)
            byte = t.scale.view(torch.uint8).item()
            got = decode(t.codes(), t.format)[0, 0].item()
            want_byte = 255 if exponent is None else exponent + 127
            same = got == element or (math.isnan(got) and math.isnan(element))
            if byte != want_byte or not same:
                failures.append(f"{case.name} {mode.value}: byte {byte}, element {got}")
    return failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    data = {
        "normal": torch.randn(args.rows, args.cols),
        "student-t3": torch.distributions.StudentT(3.0).sample((args.rows, args.cols)),
    }
    print(
        f"mx-core {mx_core.__version__}, torch {torch.__version__}; "
        f"{args.rows}x{args.cols} fp32, blocks of 32 along the last dim\n"
    )
    modes = [m.value for m in mx_core.ScaleMode]
    print("| format | data | " + " | ".join(f"{m} SQNR dB" for m in modes) + " |")
    print("|---|---|" + "---|" * len(modes))
    for fmt in mx_core.FORMAT_NAMES:
        for name, x in data.items():
            cells = [
                f"{sqnr_db(x, mx_core.quantize(x, fmt, scale_mode=m).dequantize()):.2f}"
                for m in modes
            ]
            print(f"| {fmt} | {name} | " + " | ".join(cells) + " |")
    failures = semantics_failures()
    total = sum(len(c.expected) for c in SEMANTIC_CASES)
    print(f"\nsemantics table: {total - len(failures)}/{total} cases as specified")
    for f in failures:
        print("  FAILED", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
