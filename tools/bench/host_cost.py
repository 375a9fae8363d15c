"""Host time per call of every cast and fake-quantize op (run on a GPU, or --cpu-stub),
and with ``--step`` the host time of one step of tp_layer.py's seven linears (CPU).

Wall time per call of N calls queued back to back on a small bf16 tensor (256x1024: the
kernels take a few microseconds, so the GPU waits for the host and the figure is the
launch path). Each op is timed in layers: its public function; its op
(``torch.ops.mx.*``: dispatch plus the op body, what torch.compile's generated code
calls); the op body alone; its plan (``mx_kernels.cast_plan``: output allocations and
the launch, the lookup done); and its kernel launch alone (outputs given). The
differences are the dispatcher (op - body), the public function's lookup and checks
(public - plan) and the allocations (plan - launch). torch's ``empty_strided``,
``copy_`` and ``x * 2`` in the same run are the yardstick, and the outputs of
``quantize_both`` allocated one by one against one buffer and views of it.

Target: <= 20 us per call through the public function, eager.

``--cpu-stub`` times the same layers on CPU tensors (``backend="triton"``), through
the same cached launch path as CUDA tensors take, with the kernel launch itself a
no-op (``mx_kernels.testing.cpu_cached_launches(interpret=False)``): the Python and
dispatcher cost of each layer, without a GPU.

``--check`` first runs each op on CUDA tensors of awkward shapes, strides and
alignments twice (the compiled kernel's first launch, then the cached one) with
``MX_KERNELS_CHECK_LAUNCH=1`` and compares the bits with mx-core's reference.

``--step``: the Python and dispatcher work that an MX step adds to a bf16 one, on CPU
with the cast launches stubbed, measurable without a GPU (to compare two trees; the
GPU's host is slower, and its figures come from ``tp_layer.py --profile``). The seven
linears have tp_layer's structure (q/k/v read one input, gate/up another) at tiny
widths (``--tokens`` tokens; q/k/v ``--hidden`` -> hidden/4, o hidden/4 -> hidden,
gate/up hidden -> hidden/2, down hidden/2 -> hidden), so that the CPU's GEMMs cost
little; MXLinear runs its fused path (``compute_path="fake_quant"``, Triton casts)
through the cached launch path of CUDA tensors with each launch a no-op, and its bf16
GEMMs as on CUDA (``torch.mm`` of the bf16 operands, through
``mx_nn.linear.route_bf16_gemms``; on CPU ``bf16_gemm`` multiplies in fp32). Wall time
per step, microseconds, best of rounds of steps queued back to back.
No target: context for the eager step's host cost (docs/benchmark-log.md, 2026-12-06
'TP layer: the eager step's Python').

Usage: cd tools/bench && python3 host_cost.py --check --quick   (BENCHMARKS.md's table)
       python3 tools/bench/host_cost.py [--check] [--cpu-stub] [--calls 2000] [--profile]
       python3 tools/bench/host_cost.py --step [--modes eager,compiled] [--steps 200]
Writes the table to $OUT/host_cost.md (--cpu-stub: host_cost_cpu.md) too when OUT is set.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
from common import (
    LinearShape,
    SevenLinears,
    bf16_and_mx,
    environment,
    md_table,
    publish,
    seven_linear_inputs,
    step_fn,
    wall_per_call,
)

import mx_core
import mx_kernels
from mx_core.testing import assert_same_bits
from mx_kernels import cast_plan

TARGET_US = 20.0
FMT, BS, MODE = "fp8_e4m3", 32, "rceil"
OPS = ["quantize_rowwise", "quantize_colwise", "quantize_both",
       "fake_quantize_rowwise", "fake_quantize_colwise", "fake_quantize_both"]  # fmt: skip
_BODIES = {
    "quantize_rowwise": mx_kernels.cast._quantize_rowwise_impl,
    "quantize_colwise": mx_kernels.cast._quantize_colwise_impl,
    "quantize_both": mx_kernels.cast._quantize_both_impl,
    "fake_quantize_rowwise": mx_kernels.fake_quant._fake_quantize_rowwise_impl,
    "fake_quantize_colwise": mx_kernels.fake_quant._fake_quantize_colwise_impl,
    "fake_quantize_both": mx_kernels.fake_quant._fake_quantize_both_impl,
}


def per_call(fn, calls: int, rounds: int) -> float:
    """Microseconds per call (:func:`common.wall_per_call`)."""
    return wall_per_call(fn, calls, warmup=50, rounds=rounds) * 1e6


def layers(x: torch.Tensor, backend: str) -> dict:
    """Per op: (public, op, body, plan, launch) closures."""
    out = {}
    for name in OPS:
        public, body = getattr(mx_kernels, name), _BODIES[name]
        op = getattr(torch.ops.mx, name).default
        plan = cast_plan.plan_for(name, True, x, FMT, BS, MODE, backend)
        outs = plan(x)
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        kernel_args = plan.slots([*outs, plan.dummy])
        out[name] = (
            lambda public=public: public(x, backend=backend),
            lambda op=op: op(x, FMT, BS, MODE, backend),
            lambda body=body: body(x, FMT, BS, MODE, backend),
            lambda plan=plan: plan(x),
            lambda plan=plan, args=kernel_args: plan.launch(x, *args),
        )
    return out


def both_outputs(x: torch.Tensor, backend: str) -> dict:
    """quantize_both's four outputs (public layout), allocated two ways."""
    plan = cast_plan.plan_for("quantize_both", True, x, FMT, BS, MODE, backend)
    specs, device = plan.specs, x.device
    sizes = [s.numel() for s in (torch.empty(sz, device="meta") for sz, _, _ in specs)]
    offsets = [0]
    for n in sizes[:-1]:
        offsets.append(offsets[-1] + -(-n // 16) * 16)  # 16-byte aligned views
    total = offsets[-1] + sizes[-1]

    def separate():  # as the plan does
        return [alloc() for alloc in plan.allocs]

    def one_buffer():
        buf = torch.empty(total, dtype=torch.uint8, device=device)
        by_dtype = {d: buf.view(d) for d in {d for _, _, d in specs}}
        return [
            by_dtype[d].as_strided(sz, st, o) for (sz, st, d), o in zip(specs, offsets, strict=True)
        ]

    return {"4 x empty_strided": separate, "1 x empty + views": one_buffer}


CHECK_SHAPES = [(32, 32), (17 * 32, 96), (256, 1024), (96, 4096)]


def check() -> bool:
    """Every op against mx-core on awkward CUDA inputs, twice each (first and cached
    launch), the launcher checking Triton's choice of compiled kernel on each hit."""
    before = os.environ.get("MX_KERNELS_CHECK_LAUNCH")
    os.environ["MX_KERNELS_CHECK_LAUNCH"] = "1"  # read on each cached launch
    try:
        return _check()
    finally:
        if before is None:
            os.environ.pop("MX_KERNELS_CHECK_LAUNCH")
        else:
            os.environ["MX_KERNELS_CHECK_LAUNCH"] = before


def _check() -> bool:
    ok = True
    torch.manual_seed(0)
    for m, k in CHECK_SHAPES:
        n = max(m, k)
        base = torch.randn(n + 1, n + 32, device="cuda", dtype=torch.bfloat16)
        inputs = {
            "contiguous": base[:m, :k].contiguous(),
            "row slice (unaligned)": base[1 : m + 1, :k],  # offset pointer, long rows
            "transposed": base[:k, :m].t(),  # strides (1, n + 32)
        }
        for name, x in inputs.items():
            ref_row = mx_core.quantize(x, FMT, dim=-1, scale_mode=MODE)
            ref_col = mx_core.quantize(x.t().contiguous(), FMT, dim=-1, scale_mode=MODE)
            for _ in range(2):
                q, s = mx_kernels.quantize_rowwise(x)
                q_t, s_t = mx_kernels.quantize_colwise(x)
                qr, sr, qc, sc = mx_kernels.quantize_both(x)
                fr, fc = mx_kernels.fake_quantize_both(x)
                try:
                    for got, want in (
                        (q, ref_row.qdata), (s, ref_row.scale), (qr, ref_row.qdata),
                        (sr, ref_row.scale), (q_t, ref_col.qdata), (s_t, ref_col.scale),
                        (qc, ref_col.qdata), (sc, ref_col.scale),
                        (mx_kernels.fake_quantize_rowwise(x), ref_row.dequantize(x.dtype)),
                        (fr, ref_row.dequantize(x.dtype)),
                        (fc, ref_col.dequantize(x.dtype).t()),
                        (mx_kernels.fake_quantize_colwise(x), ref_col.dequantize(x.dtype).t()),
                    ):  # fmt: skip
                        assert_same_bits(got, want)
                except AssertionError as e:
                    ok = False
                    print(f"check FAILED at {m}x{k} {name}: {e}")
    print(f"check: {'all equal' if ok else 'FAILED'}")
    return ok


def tiny_linears(hidden: int) -> list[LinearShape]:
    """``--step``'s seven linears: tp_layer's structure at widths hidden, /4 and /2."""
    small, ffn = hidden // 4, hidden // 2
    dims = [("q", "colwise", hidden, small), ("k", "colwise", hidden, small),
            ("v", "colwise", hidden, small), ("o", "rowwise", small, hidden),
            ("gate", "colwise", hidden, ffn), ("up", "colwise", hidden, ffn),
            ("down", "rowwise", ffn, hidden)]  # fmt: skip
    return [LinearShape(name=n, style=s, in_features=k, out_features=o) for n, s, k, o in dims]


def _gemm_as_on_cuda(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    bf16 = torch.bfloat16
    a, b = a.to(bf16), b.to(bf16)
    return torch.mm(a, b) if out_dtype == bf16 else torch.mm(a, b).to(out_dtype)


def step_cost(modes: list[str], steps: int, tokens: int, hidden: int) -> None:
    """Print each mode's bf16 and MX wall time per step (``--step``, module doc)."""
    import mx_nn.linear
    from mx_kernels.testing import cpu_cached_launches

    torch.set_num_threads(1)
    shapes = tiny_linears(hidden)
    config = mx_nn.MXLinearConfig(compute_path="fake_quant", cast_backend="triton")
    bf16, mx = bf16_and_mx(lambda: SevenLinears(shapes, "cpu"), config)
    xs, grads = seven_linear_inputs(shapes, tokens, "cpu")
    route = mx_nn.linear.route_bf16_gemms(_gemm_as_on_cuda)
    with route, cpu_cached_launches(interpret=False):
        for mode in modes:
            times = {}
            for name, model in (("bf16", bf16), ("mx", mx)):
                model = torch.compile(model) if mode == "compiled" else model
                times[name] = wall_per_call(step_fn(model, xs, grads), steps, warmup=5) * 1e6
            print(f"{mode}: bf16 {times['bf16']:.0f} us/step, MX {times['mx']:.0f} us/step "
                  f"(+{times['mx'] - times['bf16']:.0f})", flush=True)  # fmt: skip
    print(f"{tokens} tokens, hidden {hidden}, cast launches stubbed; {environment()}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="bit-check the cached launches first")
    p.add_argument("--cpu-stub", action="store_true", help="on CPU, the kernel launch a no-op")
    p.add_argument("--calls", type=int, default=2000, help="calls per timing round")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (best of)")
    p.add_argument("--quick", action="store_true", help="500 calls per round")
    p.add_argument("--profile", action="store_true", help="cProfile 500 quantize_rowwise calls")
    p.add_argument("--step", action="store_true", help="one seven-linear step's host time, CPU")
    p.add_argument("--modes", default="eager,compiled", help="--step: eager and/or compiled")
    p.add_argument("--steps", type=int, default=200, help="--step: steps per timing round")
    p.add_argument("--tokens", type=int, default=32, help="--step: tokens per step")
    p.add_argument("--hidden", type=int, default=128, help="--step: the widest linear's width")
    a = p.parse_args()
    calls = 500 if a.quick else a.calls
    if a.cpu_stub and a.check:
        p.error("--check runs on CUDA (the tests run the cached path on CPU)")
    if a.step and (a.check or a.cpu_stub or a.profile):
        p.error("--step: not with --check, --cpu-stub or --profile (it runs on CPU, stubbed)")
    if a.cpu_stub or a.step:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the casts' CPU path reads it per call
    if a.step:
        modes = a.modes.split(",")
        if set(modes) - {"eager", "compiled"}:
            p.error(f"--modes {a.modes!r}: allowed eager, compiled")
        step_cost(modes, a.steps, a.tokens, a.hidden)
        return 0
    if a.cpu_stub:
        from mx_kernels.testing import cpu_cached_launches

        device, backend, stub = "cpu", "triton", cpu_cached_launches(interpret=False)
    else:
        device, backend, stub = "cuda", "auto", contextlib.nullcontext()
    ok = check() if a.check else True
    with stub:
        table = timings(device, backend, calls, a.rounds)
        if a.profile:
            import cProfile
            import pstats

            x = torch.randn(256, 1024, device=device, dtype=torch.bfloat16)
            with cProfile.Profile() as prof:
                for _ in range(500):
                    mx_kernels.quantize_rowwise(x, backend=backend)
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    publish(table, "host_cost_cpu.md" if a.cpu_stub else "host_cost.md")
    return 0 if ok else 1


def timings(device: str, backend: str, calls: int, rounds: int) -> str:
    """The table of every layer of every op, and the yardsticks."""
    x = torch.randn(256, 1024, device=device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    yard = {
        "empty_strided": lambda: torch.empty_strided((256, 1024), (1024, 1), device=x.device),
        "empty_like": lambda: torch.empty_like(x),
        "copy_": lambda: y.copy_(x),
        "x * 2": lambda: x * 2,
    }
    yard.update(both_outputs(x, backend))
    yard_us = {k: per_call(fn, calls, rounds) for k, fn in yard.items()}
    rows = []
    for name, fns in layers(x, backend).items():
        public, op, body, plan, launch_ = (per_call(fn, calls, rounds) for fn in fns)
        met = "-" if device != "cuda" else "met" if public <= TARGET_US else "MISSED"
        us = (public, op, body, plan, launch_, op - body, public - plan, plan - launch_)
        rows.append((name, *(f"{t:.1f}" for t in us), met))
    header = ["op", "public", "op", "body", "plan", "launch", "dispatch", "lookup", "allocs",
              "target"]  # fmt: skip
    yardsticks = ", ".join(f"{k} {v:.1f}" for k, v in yard_us.items())
    where = "" if device == "cuda" else "; CPU, kernel launch stubbed"
    return f"{md_table(header, rows)}\n\nus per call; in the same run: {yardsticks}{where}"


if __name__ == "__main__":
    sys.exit(main())
