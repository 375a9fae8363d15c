"""Host time per call of every cast and fake-quantize op (run on a GPU, or --cpu-stub).

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
``MX_KERNELS_CHECK_LAUNCH=1`` semantics and compares the bits with mx-core's reference.

Usage: python tools/bench/host_cost.py [--check] [--cpu-stub] [--calls 2000]
Writes the table to $OUT/host_cost.md (--cpu-stub: host_cost_cpu.md) too when OUT is set.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
from report import publish, wall_per_call

import mx_core
import mx_kernels
from mx_core.testing import assert_same_bits
from mx_kernels import cast_plan, launch

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
    """Microseconds per call (:func:`report.wall_per_call`)."""
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
    launch._CHECK = True
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
    launch._CHECK = False
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="bit-check the cached launches first")
    p.add_argument("--cpu-stub", action="store_true", help="on CPU, the kernel launch a no-op")
    p.add_argument("--calls", type=int, default=2000, help="calls per timing round")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (best of)")
    p.add_argument("--quick", action="store_true", help="500 calls per round")
    p.add_argument("--profile", action="store_true", help="cProfile 500 quantize_rowwise calls")
    a = p.parse_args()
    calls = 500 if a.quick else a.calls
    if a.cpu_stub and a.check:
        p.error("--check runs on CUDA (the tests run the cached path on CPU)")
    if a.cpu_stub:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import
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
    rows = [
        "| op | public | op | body | plan | launch | dispatch | lookup | allocs | target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, fns in layers(x, backend).items():
        public, op, body, plan, launch_ = (per_call(fn, calls, rounds) for fn in fns)
        met = "-" if device != "cuda" else "met" if public <= TARGET_US else "MISSED"
        rows.append(
            f"| {name} | {public:.1f} | {op:.1f} | {body:.1f} | {plan:.1f} | {launch_:.1f} | "
            f"{op - body:.1f} | {public - plan:.1f} | {plan - launch_:.1f} | {met} |"
        )
    rows.append(
        "\nus per call; in the same run: " + ", ".join(f"{k} {v:.1f}" for k, v in yard_us.items())
    )
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU, kernel launch stubbed"
    rows.append(f"torch {torch.__version__}, {where}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
