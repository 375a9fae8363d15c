"""Benchmark MXLinear forward + backward against bf16 nn.Linear (run on a GPU).

For each (M, K, N): the same bf16 weights in nn.Linear and MXLinear ("mxfp8" recipe),
input [M, K] bf16; times forward + backward (``do_bench`` median, ms), eager and with
--compile also torch.compile'd, and the peak memory of one step. Checks the MX output's
SQNR against bf16 first (>= 25 dB), and on sm90 the fused path against the MX path.

Targets (MX time / bf16 time): compiled MXLinear <= 1.0x; eager <= 1.1x.

Usage: python3 tools/bench/linear.py --compile   (BENCHMARKS.md's table; run_all.sh's
       linear step)
       python3 tools/bench/linear.py [--quick] [--compile] [--recipe mxfp8]
Writes the table to $OUT/linear.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import sys
import traceback

import torch
from common import bench_ms, environment, md_table, publish, step_fn

import mx_nn
from mx_core.testing import sqnr_db

SHAPES = [(16384, 4096, 4096), (16384, 4096, 14336), (16384, 14336, 4096)]


def same_as_mx_path(mx, x, grad) -> bool:
    """Where MXLinear fuses casts and dequantize (sm90), check it against its MX path
    (casts + scaled_mm, forced by compute_path="mx"): same forward bits, gradients
    within bf16 rounding (cuBLAS may order the sums differently per layout)."""
    config = dataclasses.replace(mx.config, compute_path="mx")
    twin = mx_nn.MXLinear.from_linear(mx, config)
    results = []
    for module in (mx, twin):
        xx = x.detach().clone().requires_grad_()
        y = module(xx)
        y.backward(grad)
        results.append((y, xx.grad, module.weight.grad.clone()))
        module.weight.grad = None
    (y0, gx0, gw0), (y1, gx1, gw1) = results
    rel = [((a.float() - b.float()).norm() / b.float().norm()).item()
           for a, b in ((gx0, gx1), (gw0, gw1))]  # fmt: skip
    good = torch.equal(y0, y1) and max(rel) <= 1e-2
    print(f"fused vs MX path: forward equal {torch.equal(y0, y1)}, grad rel err {rel}")
    return good


def peak_mib(step) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--recipe", default="mxfp8")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("mx_nn").setLevel(logging.INFO)  # which path MXLinear runs
    print(f"{environment()}; recipe {args.recipe}")
    shapes = [(4096, 4096, 4096)] if args.quick else SHAPES
    rows, ok = [], True
    for m, k, n in shapes:
        ref = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        config = mx_nn.MXLinearConfig.from_recipe(args.recipe)
        mx = mx_nn.MXLinear.from_linear(copy.deepcopy(ref), config)  # the same weights
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        sqnr = sqnr_db(ref(x).float(), mx(x).float())
        ok &= sqnr >= 25
        ok &= same_as_mx_path(mx, x, grad)
        variants = [("eager", ref, mx)]
        if args.compile:
            # Default torch.compile: the third shape recompiles with dynamic sizes, which
            # torch 2.11 used to fail on (docs/benchmark-log.md, 2026-12-02 'MXLinear: MX
            # path').
            variants.append(("compiled", torch.compile(ref), torch.compile(mx)))
        for mode, r, q in variants:
            times, mems = [], []
            for module in (r, q):
                step = step_fn(module, x, grad)
                try:
                    step()  # compile / warm up
                except Exception:  # report the failure, keep measuring the rest
                    traceback.print_exc()
                    ok = False
                    times.append(float("nan"))
                    mems.append(float("nan"))
                    continue
                times.append(bench_ms(step, grad_to_none=[x, ref.weight, mx.weight]))
                mems.append(peak_mib(step))
            rows.append((f"{m}x{k}x{n}", mode, f"{times[0]:.3f}", f"{times[1]:.3f}",
                         f"{times[1] / times[0]:.2f}", f"{mems[0]:.0f}", f"{mems[1]:.0f}",
                         f"{sqnr:.1f}"))  # fmt: skip
    header = ["M x K x N", "mode", "bf16 ms", "MX ms", "MX / bf16", "bf16 peak MiB",
              "MX peak MiB", "output SQNR dB"]  # fmt: skip
    publish(md_table(header, rows), "linear.md")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
