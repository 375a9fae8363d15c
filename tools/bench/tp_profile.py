"""Where one step of ``tp_layer.py`` spends its time (run on a GPU): per mode, the wall
time per step, the host's time to issue one step, the GPU's busy time per step (the sum
of its kernels' durations: one stream, so they never overlap) and the idle rest, and the
kernels grouped by name; with ``--cprofile``, the host's Python functions of each run's
steps by their own time.

A step whose GPU idles for a large part of its wall time waits for the host; a step
whose busy time exceeds bf16's by the ratio measured spends it in kernels.

Usage: python tools/bench/tp_profile.py [--tp 8] [--modes eager,compiled] [--cprofile]
Writes the tables to $OUT/tp_profile.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time

import torch
from report import publish, wall_per_call
from torch.profiler import ProfilerActivity, profile
from tp_layer import TOKENS, inputs, models, step_fn


def gpu_kernels(step, steps: int) -> tuple[float, dict[str, tuple[int, float]]]:
    """(busy ms per step, {kernel name: (launches per step, ms per step)})."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    groups: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            g = groups[e.name[:70]]
            g[0] += 1
            g[1] += e.device_time_total / 1e3
    busy = sum(t for _, t in groups.values()) / steps
    return busy, {k: (n // steps, t / steps) for k, (n, t) in groups.items()}


def host_per_step(step, steps: int) -> float:
    """Median ms the host takes to issue one step, each started on an idle GPU (synced
    before), so that no launch waits for a full queue: the host's own time."""
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", default="8", help="comma-separated TP degrees")
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--recipe", default="mxfp8")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--cprofile", action="store_true", help="cProfile every run's steps")
    p.add_argument("--top", type=int, default=14, help="kernels listed per run")
    p.add_argument("--top-functions", type=int, default=35, help="functions listed per profile")
    a = p.parse_args()
    out = []
    for tp in (int(t) for t in a.tp.split(",")):
        bf16, mx = models(tp, a.recipe)
        xs, grads = inputs(tp)
        summary = [
            "| run | wall ms/step | host ms/step | GPU busy ms/step | GPU idle | kernels/step |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        detail = []
        for mode in a.modes.split(","):
            for name, model in (("bf16", bf16), ("mx", mx)):
                m = torch.compile(model) if mode == "compiled" else model
                step = step_fn(m, xs, grads)
                wall = wall_per_call(step, a.steps, warmup=3) * 1e3
                host = host_per_step(step, a.steps)
                busy, kernels = gpu_kernels(step, a.steps)
                count = sum(n for n, _ in kernels.values())
                summary.append(f"| TP={tp} {name} {mode} | {wall:.3f} | {host:.3f} | {busy:.3f} | "
                               f"{max(0.0, 1 - busy / wall):.0%} | {count} |")  # fmt: skip
                detail.append(f"\nTP={tp} {name} {mode}: kernel | launches/step | ms/step")
                top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[: a.top]
                detail += [f"  {k} | {n} | {t:.3f}" for k, (n, t) in top]
                if a.cprofile:
                    import cProfile
                    import io
                    import pstats

                    with cProfile.Profile() as pr:
                        for _ in range(a.steps):
                            step()
                        torch.cuda.synchronize()
                    s = io.StringIO()
                    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.top_functions)
                    detail.append(f"TP={tp} {name} {mode}, {a.steps} steps:\n{s.getvalue()}")
                if mode == "compiled":
                    torch._dynamo.reset()
        out += summary + detail + [""]
    out.append(f"{a.recipe}, {TOKENS} tokens; torch {torch.__version__}, "
               f"{torch.cuda.get_device_name()}")  # fmt: skip
    publish("\n".join(out), "tp_profile.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
