"""Compiled MXLinear steps of ``tp_layer.py`` with the weight's and dY's casts launched by
the compiler (the fake-quantize ops' inline overloads) against the same casts called as
ops (``MX_KERNELS_INLINE=0`` while compiling), and bf16, in one process (run on a GPU).

Between processes a host-bound step's time moves by more than this difference
(BENCHMARKS.md, 2026-12-05 'TP layer: where the step goes'), so the three compiled steps
are built in one process and timed in alternation, round after round: wall time per
step of 20 steps queued back to back (ms, best of three), its median over the rounds,
and each round's ratio to bf16's. Context, not a target: the targets are tp_layer's.

Usage: python tools/bench/inline_ab.py [--quick] [--tp 8,4] [--rounds 6]
Writes the table to $OUT/inline_ab.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from report import publish, wall_per_call
from tp_layer import TOKENS, inputs, models, step_fn

VARIANTS = ("bf16", "MX, casts as ops", "MX, inline casts")


def compiled_steps(tp: int, recipe: str) -> dict:
    """The three compiled steps, each compiled under its own MX_KERNELS_INLINE."""
    xs, grads = inputs(tp)
    steps = {}
    before = os.environ.get("MX_KERNELS_INLINE")
    try:
        for name in VARIANTS:
            bf16, mx = models(tp, recipe)
            os.environ["MX_KERNELS_INLINE"] = "0" if name == "MX, casts as ops" else "1"
            step = step_fn(torch.compile(bf16 if name == "bf16" else mx), xs, grads)
            for _ in range(3):  # compiles here, under this variant's setting
                step()
            torch.cuda.synchronize()
            steps[name] = step
    finally:
        if before is None:
            os.environ.pop("MX_KERNELS_INLINE", None)
        else:
            os.environ["MX_KERNELS_INLINE"] = before
    return steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    p.add_argument("--tp", default="8,4", help="comma-separated TP degrees")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--recipe", default="mxfp8")
    a = p.parse_args()
    rounds = 2 if a.quick else a.rounds
    rows = [
        "| per-rank shapes of | variant | wall ms per round | median | median / bf16 | "
        "per-round / bf16 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for tp in (int(t) for t in a.tp.split(",")):
        steps = compiled_steps(tp, a.recipe)
        walls: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                walls[name].append(wall_per_call(step, 20, warmup=2) * 1e3)
        base = statistics.median(walls["bf16"])
        for name, w in walls.items():
            per_round = ", ".join(f"{x / b:.3f}" for x, b in zip(w, walls["bf16"], strict=True))
            rows.append(
                f"| TP={tp} | {name} | {', '.join(f'{x:.3f}' for x in w)} | "
                f"{statistics.median(w):.3f} | {statistics.median(w) / base:.3f} | {per_round} |"
            )
            print(rows[-1], flush=True)
        torch._dynamo.reset()
    rows.append(f"\n{a.recipe}, {TOKENS} tokens; torch {torch.__version__}, "
                f"{torch.cuda.get_device_name()}")  # fmt: skip
    publish("\n".join(rows), "inline_ab.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
