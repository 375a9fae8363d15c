"""Benchmark MXLinear forward + backward against bf16 nn.Linear (run on a GPU).

For each (M, K, N): the same bf16 weights in nn.Linear and MXLinear ("mxfp8" recipe),
input [M, K] bf16; times forward + backward (median, ms), eager and with --compile also
torch.compile'd, and the peak memory of one step. Checks the MX output's SQNR against
bf16 first.

Targets: compiled MXLinear <= 1.0x the bf16 time; eager <= 1.1x.

Usage: python tools/bench/linear.py [--quick] [--compile] [--recipe mxfp8]
Writes the table to $OUT/linear.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import traceback

import torch
import triton
from report import publish

import mx_nn
from mx_core.testing import sqnr_db

SHAPES = [(16384, 4096, 4096), (16384, 4096, 14336), (16384, 14336, 4096)]


def step_fn(module, x, grad):
    def step():
        y = module(x)
        y.backward(grad)

    return step


def same_as_mx_path(mx, x, grad) -> bool:
    """Where MXLinear fuses casts and dequantize (sm90), check it against its MX path
    (casts + scaled_mm, forced by save_mx_activations): same forward bits, gradients
    within bf16 rounding (cuBLAS may order the sums differently per layout)."""
    config = dataclasses.replace(mx.config, save_mx_activations=True)
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
    props = torch.cuda.get_device_properties(0)
    print(
        f"GPU {props.name}, torch {torch.__version__}, triton {triton.__version__}, "
        f"recipe {args.recipe}"
    )
    shapes = [(4096, 4096, 4096)] if args.quick else SHAPES
    rows, ok = [], True
    for m, k, n in shapes:
        ref = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        mx = mx_nn.MXLinear.from_linear(
            torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16),
            mx_nn.MXLinearConfig.from_recipe(args.recipe),
        )
        mx.weight = torch.nn.Parameter(ref.weight.detach().clone())
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        sqnr = sqnr_db(ref(x).float(), mx(x).float())
        ok &= sqnr >= 25
        ok &= same_as_mx_path(mx, x, grad)
        variants = [("eager", ref, mx)]
        if args.compile:
            # Default torch.compile: the third shape recompiles with dynamic sizes, which
            # torch 2.11 used to fail on (BENCHMARKS.md).
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
                times.append(
                    triton.testing.do_bench(
                        step, grad_to_none=[x, ref.weight, mx.weight], return_mode="median"
                    )
                )
                mems.append(peak_mib(step))
            rows.append(
                (
                    f"{m}x{k}x{n}",
                    mode,
                    times[0],
                    times[1],
                    times[1] / times[0],
                    mems[0],
                    mems[1],
                    sqnr,
                )
            )
    lines = [
        "| M x K x N | mode | bf16 ms | MX ms | MX / bf16 | bf16 peak MiB | MX peak MiB |"
        " output SQNR dB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for shape, mode, t_ref, t_mx, ratio, m_ref, m_mx, sqnr in rows:
        lines.append(
            f"| {shape} | {mode} | {t_ref:.3f} | {t_mx:.3f} | {ratio:.2f} | "
            f"{m_ref:.0f} | {m_mx:.0f} | {sqnr:.1f} |"
        )
    publish("\n".join(lines), "linear.md")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
