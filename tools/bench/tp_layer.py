"""The seven linears of one Llama-3-8B layer at the per-rank widths of tensor
parallelism, MXLinear against bf16 nn.Linear, forward + backward (run on a GPU).

Per rank at TP degree t (8192 tokens, hidden 4096, 32 heads, 8 KV heads, FFN 14336):
q 4096 -> 4096/t, k and v 4096 -> 1024/t, o 4096/t -> 4096, gate and up 4096 -> 14336/t,
down 14336/t -> 4096 (colwise layers shard their outputs, rowwise ones their inputs).
q, k and v read one input, and so do gate and up, as in the layer (MXLinear casts a
shared input once). One step runs all seven forward and backward (weights' grads
kept, as in training); its time is the wall time per step of steps queued back to back
(host and GPU: at small per-rank shapes the host's launch path is what the GPU waits
for), best of three rounds. bf16 and MX alternate in the same run, eager and each
``torch.compile``'d; ``--cudagraphs`` adds ``torch.compile(mode="reduce-overhead")``
(context, not judged: it takes the host out of the step).

``--layer``: the layer's whole path through its linears instead (``common.LayerPath``:
the two RMSNorms, the residual adds and SwiGLU around the seven linears; the attention
core left out, its output an input), where a fused producer's saving shows. The targets
of that path: TP=8 compiled <= 1.10x, eager <= 1.15x; TP=4 compiled <= 1.03x; TP=1 and
TP=2 <= 1.0x.

Targets (MX / bf16 step time): at TP=4 and TP=8, compiled <= 1.0x (floor 1.10) and eager
<= 1.15x; at TP=1 and TP=2, compiled <= 1.0x.

``--profile``: where a step spends its time, per mode (``--modes``): the wall time per
step, the host's time to issue one step on an idle GPU, the GPU's busy time per step
(the sum of its kernels' durations: one stream, so they never overlap) and the idle
rest, and the kernels grouped by name; with ``--cprofile``, the host's Python functions
by their own time. A step whose GPU idles for a large part of its wall time waits for
the host; one whose busy time exceeds bf16's by the ratio measured spends it in kernels.

``--inline-ab``: the compiled MX step with the weight's and dY's casts launched by the
compiler (the fake-quantize ops' inline overloads) against the same casts called as ops
(``MX_KERNELS_INLINE=0`` while compiling), and bf16: between processes a host-bound
step's time moves by more than this difference (docs/benchmark-log.md, 2026-12-05 'TP
layer: where the step goes'), so the three are built in one process and timed in
alternation over ``--rounds`` rounds (20 steps each, best of three), with the median
and each round's ratio to bf16. Context, not a target.

Usage: cd tools/bench && python3 tp_layer.py --cudagraphs   (BENCHMARKS.md's table)
       python3 tools/bench/tp_layer.py --layer [--cudagraphs]   (the whole layer path)
       python3 tools/bench/tp_layer.py [--quick] [--tp 1,2,4,8] [--recipe mxfp8]
       python3 tools/bench/tp_layer.py --profile [--tp 8] [--modes eager,compiled]
       [--steps 10] [--cprofile]
       python3 tools/bench/tp_layer.py --inline-ab [--tp 8,4] [--rounds 6]
Writes the table to $OUT/tp_layer.md (tp_layer_path.md, tp_profile.md, inline_ab.md)
when OUT is set.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import torch
from common import (
    TOKENS,
    LayerPath,
    SevenLinears,
    bf16_and_mx,
    environment,
    layer_path_inputs,
    llama3_8b_linears,
    md_table,
    publish,
    seven_linear_inputs,
    step_fn,
    wall_per_call,
)

TARGETS = {1: (1.0, None), 2: (1.0, None), 4: (1.0, 1.15), 8: (1.0, 1.15)}  # (compiled, eager)
LAYER_TARGETS = {1: (1.0, None), 2: (1.0, None), 4: (1.03, None), 8: (1.10, 1.15)}  # --layer
DEFAULT_TP = {"table": "1,2,4,8", "profile": "8", "inline_ab": "8,4"}
LAYER = False
"""``--layer``: time :class:`common.LayerPath` instead of :class:`common.SevenLinears`."""


def models(tp: int, recipe: str) -> tuple[SevenLinears, SevenLinears]:
    """The bf16 model at TP degree ``tp`` and its MX copy (same weights)."""
    cls = LayerPath if LAYER else SevenLinears
    return bf16_and_mx(lambda: cls(llama3_8b_linears(tp), "cuda"), recipe)


def inputs(tp: int):
    """(the inputs requiring grad, each output's grad) at TP degree ``tp``."""
    make = layer_path_inputs if LAYER else seven_linear_inputs
    return make(llama3_8b_linears(tp), TOKENS, "cuda")


def run_tp(tp: int, recipe: str, steps: int, modes: tuple[str, ...]) -> dict[str, float]:
    """ms per step of "bf16 <mode>" and "mx <mode>" for each of ``modes``."""
    (bf16, mx), (xs, grads) = models(tp, recipe), inputs(tp)
    out = {}
    for mode in modes:
        for name, model in (("bf16", bf16), ("mx", mx)):
            if mode == "compiled":
                model = torch.compile(model)
            elif mode == "cudagraphs":  # a user option: it takes the host out of the step
                model = torch.compile(model, mode="reduce-overhead")
            out[f"{name} {mode}"] = wall_per_call(step_fn(model, xs, grads), steps, warmup=3) * 1e3
            if mode != "eager":
                torch._dynamo.reset()
    return out


def table(degrees: list[int], recipe: str, steps: int, cudagraphs: bool) -> str:
    header = ["per-rank shapes of", "bf16 eager ms", "MX eager ms", "MX / bf16 eager",
              "bf16 compiled ms", "MX compiled ms", "MX / bf16 compiled",
              "CUDA graphs bf16 / MX ms", "targets"]  # fmt: skip
    rows = []
    for tp in degrees:
        modes = ("eager", "compiled", "cudagraphs") if cudagraphs else ("eager", "compiled")
        t = run_tp(tp, recipe, steps, modes)
        eager = t["mx eager"] / t["bf16 eager"]
        comp = t["mx compiled"] / t["bf16 compiled"]
        want_c, want_e = (LAYER_TARGETS if LAYER else TARGETS)[tp]
        verdict = [f"compiled {'met' if comp <= want_c else 'MISSED'} (<= {want_c})"]
        if want_e:
            verdict.append(f"eager {'met' if eager <= want_e else 'MISSED'} (<= {want_e})")
        graphs = f"{t['bf16 cudagraphs']:.3f} / {t['mx cudagraphs']:.3f}" if cudagraphs else "-"
        rows.append((f"TP={tp}", f"{t['bf16 eager']:.3f}", f"{t['mx eager']:.3f}",
                     f"{eager:.2f}", f"{t['bf16 compiled']:.3f}", f"{t['mx compiled']:.3f}",
                     f"{comp:.2f}", graphs, "; ".join(verdict)))  # fmt: skip
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    what = "the layer path (norms, SwiGLU, residual adds)" if LAYER else "the seven linears"
    return f"{md_table(header, rows)}\n\n{what}, {recipe}, {TOKENS} tokens"


def gpu_kernels(step, steps: int) -> tuple[float, dict[str, tuple[int, float]]]:
    """(busy ms per step, {kernel name: (launches per step, ms per step)})."""
    from torch.profiler import ProfilerActivity, profile

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


def cprofiled(step, steps: int, top: int) -> str:
    """The ``top`` Python functions of ``steps`` steps by their own time."""
    import cProfile
    import io
    import pstats

    with cProfile.Profile() as pr:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def profile_steps(degrees: list[int], a: argparse.Namespace, steps: int) -> str:
    out = []
    for tp in degrees:
        (bf16, mx), (xs, grads) = models(tp, a.recipe), inputs(tp)
        summary, detail = [], []
        for mode in a.modes.split(","):
            for name, model in (("bf16", bf16), ("mx", mx)):
                step = step_fn(torch.compile(model) if mode == "compiled" else model, xs, grads)
                wall = wall_per_call(step, steps, warmup=3) * 1e3
                host = host_per_step(step, steps)
                busy, kernels = gpu_kernels(step, steps)
                count = sum(n for n, _ in kernels.values())
                idle = max(0.0, 1 - busy / wall)
                summary.append((f"TP={tp} {name} {mode}", f"{wall:.3f}", f"{host:.3f}",
                                f"{busy:.3f}", f"{idle:.0%}", count))  # fmt: skip
                detail.append(f"\nTP={tp} {name} {mode}: kernel | launches/step | ms/step")
                top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[: a.top]
                detail += [f"  {k} | {n} | {t:.3f}" for k, (n, t) in top]
                if a.cprofile:
                    functions = cprofiled(step, steps, a.top_functions)
                    detail.append(f"TP={tp} {name} {mode}, {steps} steps:\n{functions}")
                if mode == "compiled":
                    torch._dynamo.reset()
        header = ["run", "wall ms/step", "host ms/step", "GPU busy ms/step", "GPU idle",
                  "kernels/step"]  # fmt: skip
        out += [md_table(header, summary), *detail, ""]
    return "\n".join(out) + f"\n{a.recipe}, {TOKENS} tokens"


VARIANTS = ("bf16", "MX, casts as ops", "MX, inline casts")


def compiled_steps(tp: int, recipe: str) -> dict:
    """The three compiled steps of ``--inline-ab``, each compiled under its own
    MX_KERNELS_INLINE."""
    (xs, grads), steps = inputs(tp), {}
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


def inline_ab(degrees: list[int], recipe: str, rounds: int) -> str:
    header = ["per-rank shapes of", "variant", "wall ms per round", "median", "median / bf16",
              "per-round / bf16"]  # fmt: skip
    rows = []
    for tp in degrees:
        steps = compiled_steps(tp, recipe)
        walls: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                walls[name].append(wall_per_call(step, 20, warmup=2) * 1e3)
        base = statistics.median(walls["bf16"])
        for name, w in walls.items():
            per_round = ", ".join(f"{x / b:.3f}" for x, b in zip(w, walls["bf16"], strict=True))
            rows.append((f"TP={tp}", name, ", ".join(f"{x:.3f}" for x in w),
                         f"{statistics.median(w):.3f}", f"{statistics.median(w) / base:.3f}",
                         per_round))  # fmt: skip
            print("| " + " | ".join(rows[-1]) + " |", flush=True)
        torch._dynamo.reset()
    return f"{md_table(header, rows)}\n\n{recipe}, {TOKENS} tokens"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group()
    what.add_argument("--profile", action="store_true", help="where a step's time goes")
    what.add_argument("--inline-ab", action="store_true", help="inline casts against ops")
    p.add_argument("--quick", action="store_true", help="fewer steps (rounds) per timing")
    p.add_argument(
        "--layer", action="store_true", help="the layer path: norms and SwiGLU around the linears"
    )
    p.add_argument(
        "--tp", help="comma-separated TP degrees (default: 1,2,4,8; --profile 8; --inline-ab 8,4)"
    )
    p.add_argument("--recipe", default="mxfp8", help="an mx_nn recipe")
    p.add_argument(
        "--steps", type=int, help="steps per timing (default 20, --quick 5; --profile 10, 3)"
    )
    p.add_argument(
        "--cudagraphs",
        action="store_true",
        help="also torch.compile(mode='reduce-overhead') (context, not judged)",
    )
    p.add_argument("--modes", default="eager,compiled", help="--profile: modes to profile")
    p.add_argument("--cprofile", action="store_true", help="--profile: cProfile each run")
    p.add_argument("--top", type=int, default=14, help="--profile: kernels listed per run")
    p.add_argument(
        "--top-functions",
        type=int,
        default=35,
        help="--profile --cprofile: functions listed per run",
    )
    p.add_argument("--rounds", type=int, default=6, help="--inline-ab: rounds (--quick 2)")
    a = p.parse_args()
    kind = "profile" if a.profile else "inline_ab" if a.inline_ab else "table"
    if a.cudagraphs and kind != "table":
        p.error("--cudagraphs: only for the table (not with --profile or --inline-ab)")
    if (a.cprofile or a.modes != "eager,compiled") and kind != "profile":
        p.error("--cprofile and --modes: only with --profile")
    if a.steps is not None and kind == "inline_ab":
        p.error("--steps: not with --inline-ab (each round times 20 steps; see --rounds)")
    if a.rounds != 6 and kind != "inline_ab":
        p.error("--rounds: only with --inline-ab")
    bad_modes = set(a.modes.split(",")) - {"eager", "compiled"}
    if bad_modes:
        p.error(f"--modes {sorted(bad_modes)}: allowed eager, compiled")
    degrees = [int(t) for t in (a.tp or DEFAULT_TP[kind]).split(",")]
    bad = [t for t in degrees if t not in TARGETS]
    if bad:
        p.error(f"--tp {bad}: allowed degrees are {sorted(TARGETS)}")
    global LAYER
    LAYER = a.layer
    print(environment(), flush=True)
    if kind == "profile":
        publish(profile_steps(degrees, a, a.steps or (3 if a.quick else 10)), "tp_profile.md")
    elif kind == "inline_ab":
        publish(inline_ab(degrees, a.recipe, 2 if a.quick else a.rounds), "inline_ab.md")
    else:
        steps = a.steps or (5 if a.quick else 20)
        name = "tp_layer_path.md" if a.layer else "tp_layer.md"
        publish(table(degrees, a.recipe, steps, a.cudagraphs), name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
