"""Benchmark the MX casts against device-to-device copy bandwidth (run on a GPU).

For each bf16 input shape: checks the Triton casts bit-exact against mx-core's reference
on the GPU (and the fused cast + dequantize, ``fake_quantize_both``, against quantize +
dequantize, every format), then reports each cast's effective bandwidth (bytes read +
bytes written, scales included) divided by that of a plain copy of the same input,
measured in the same run and the same way: rowwise, colwise, ``both`` (one read, both
orientations) and the ``fake_`` kinds (fake-quantized values out, MXLinear's sm90 path;
``fake_rowwise_codes_colwise``: values along K, MX codes along M, what the sm90 path
casts its input to when it saves MX activations).

Timing: kernels back to back in a CUDA graph (``do_bench_cudagraph``), the judged figure,
and ``do_bench`` (one launch from Python per timing, L2 flushed before each) beside it.
A cast's Python launch path takes 60-110 us on the H200 host, longer than its kernel
at 16384x4096, and ``do_bench`` counts the GPU waiting for it: that read 0.42-0.68 for
kernels whose CUDA-graph and profiler (CUPTI) times said 0.98-0.99 (docs/benchmark-log.md,
2026-12-03 'Casts: CUDA-graph timing'). The host time per call is reported in its own
column.

Targets (of copy bandwidth, CUDA graph): rowwise >= 0.90, columnwise >= 0.85,
both-in-one-pass >= 0.85.

Usage: cd tools/bench && python3 casts.py --check quick --sweep   (BENCHMARKS.md's table)
       python3 tools/bench/casts.py [--quick] [--sweep] [--check full|quick]
       [--fmt fp8_e4m3] [--mode rceil]
Writes the table to $OUT/casts.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from common import (
    MIXED_KIND,
    CopyBaseline,
    cast_bytes,
    environment,
    graph_and_bench_ms,
    md_table,
    publish,
    run_cast,
    same_bits,
)

import mx_core
import mx_kernels
from mx_core.testing import SEMANTIC_CASES, semantic_inputs
from mx_kernels.cast_launch import TILE_CONFIGS, CastTile

SHAPES = [(16384, 4096), (16384, 8192), (8192, 14336)]
QUICK_SHAPES = [(4096, 4096)]
DEVICE = "cuda"  # a module constant so that a CPU smoke run can patch it
TARGETS = {"rowwise": 0.90, "colwise": 0.85, "both": 0.85}
# Candidates per cast kind (mx_kernels.cast_launch.CastTile fields: block_m, block_k, warps,
# programs_per_sm, stages, k_first, max_regs, lanes_m, words).
SWEEP = {
    "rowwise": [(8, 1024, 4), (4, 2048, 8, 0, 1, True), (8, 1024, 4, 4, 2)],
    "colwise": [(32, 128, 1, 0, 1, True), (32, 128, 2)],
    "both": [
        (32, 128, 2, 0, 1, True),  # the default before 2026-12-03
        (128, 64, 4, 0, 1, False, 96, 8),  # the default before word stores: byte transpose
        (128, 64, 4, 0, 1, False, 96, 8, True),  # M first
        (128, 64, 4, 0, 1, True, 0, 8, True),  # uncapped registers
        (256, 64, 8, 0, 1, False, 0, 8, True),  # 256-byte runs of x^T's rows
        (128, 64, 4, 4, 2, False, 96, 8, True),  # persistent, loads pipelined
    ],
    "fake_rowwise": [(8, 1024, 4, 0, 1, True), (4, 2048, 8)],
    "fake_colwise": [(32, 128, 1), (32, 128, 2, 0, 1, True)],
    "fake_both": [(32, 128, 2), (32, 64, 1, 0, 1, True)],
    MIXED_KIND: [(32, 128, 2, 0, 1, True), (128, 64, 4, 0, 1, True, 0, 8, True)],
}


def _host_us(fn, calls: int = 200) -> float:
    """Host microseconds per call of ``fn``, launches queued without waiting."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def check_bit_exact(device: str, quick: bool = False, modes=None, dtypes=None) -> list[str]:
    """Compare the Triton casts (both rounding paths) with mx_core.quantize on ``device``.

    ``quick``: bf16 inputs, rceil, the GPU's rounding path only (every format).
    ``modes`` / ``dtypes`` narrow the full check, e.g. to split it over processes (it
    compiles hundreds of kernels: over 9 minutes in one process on the H200's host).
    """
    failures = []
    g = torch.Generator(device=device).manual_seed(0)
    modes = modes or (("rceil",) if quick else ("floor", "ceil", "even", "rceil"))
    dtypes = dtypes or (
        (torch.bfloat16,) if quick else (torch.float32, torch.bfloat16, torch.float16)
    )
    for fmt in mx_core.FORMAT_NAMES:
        for mode in modes:
            for dtype in dtypes:
                rnd = torch.randn(544, 1056, device=device, generator=g)
                rnd = rnd * torch.exp2(torch.randint(-12, 12, (544, 1), device=device, generator=g))
                sem = semantic_inputs(fmt, dtype).to(device).repeat(32, 1)  # rows % 32 == 0
                for x in (sem, rnd.to(dtype), rnd.to(dtype).t()):
                    ref_row = mx_core.quantize(x, fmt, scale_mode=mode)
                    ref_col = mx_core.quantize(x.t().contiguous(), fmt, scale_mode=mode)
                    want = (ref_row.qdata, ref_row.scale, ref_col.qdata, ref_col.scale)
                    hw_paths = (None,) if quick or not fmt.startswith("fp8") else (None, False)
                    for hw_round in hw_paths:
                        for kind in ("rowwise", "colwise", "both"):
                            out = run_cast(kind, x, fmt, mode, hw_round=hw_round)()
                            pairs = [
                                (o, w) for o, w in zip(out, want, strict=True) if o is not None
                            ]
                            if not all(same_bits(o, w) for o, w in pairs):
                                failures.append(
                                    f"{kind} {fmt} {mode} {dtype} {tuple(x.shape)} "
                                    f"hw_round={hw_round}"
                                )
    what = "quick: bf16, rceil, GPU rounding" if quick else "both rounding paths"
    what += f"; {', '.join(modes)}; {', '.join(str(d).split('.')[-1] for d in dtypes)}"
    print(
        f"bit-exact check ({len(SEMANTIC_CASES)} semantic cases, random data, {what}): "
        f"{'all equal' if not failures else f'{len(failures)} FAILURES'}"
    )
    for f in failures[:20]:
        print("  FAILED", f)
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one small shape, no sweep")
    p.add_argument("--sweep", action="store_true", help="also time the SWEEP tiles at every shape")
    p.add_argument(
        "--check",
        choices=["full", "quick"],
        default="full",
        help="bit-exact check before timing: every format/mode/dtype, or a subset",
    )
    p.add_argument("--fmt", default="fp8_e4m3")
    p.add_argument("--mode", default="rceil")
    args = p.parse_args(argv)
    dev = DEVICE
    print(environment())
    failures = check_bit_exact(dev, quick=args.check == "quick")
    x = torch.randn(256, 512, device=dev, dtype=torch.bfloat16)
    api = mx_kernels.quantize_both(x)  # the public ops, auto backend
    ref = mx_core.quantize(x), mx_core.quantize(x.t().contiguous())
    want = (ref[0].qdata, ref[0].scale, ref[1].qdata, ref[1].scale)
    if not all(same_bits(a, w) for a, w in zip(api, want, strict=True)):
        failures.append("mx_kernels.quantize_both (auto) differs from mx_core.quantize")
        print("  FAILED public API check")
    for fmt in mx_core.FORMAT_NAMES:  # the fused cast + dequantize (MXLinear's sm90 path)
        xr = x * torch.exp2(torch.randint(-12, 12, (256, 1), device=dev))
        row, col = mx_kernels.fake_quantize_both(xr, fmt)
        want_fq = [mx_core.quantize(xr, fmt, dim=d).dequantize(xr.dtype) for d in (-1, 0)]
        if not (torch.equal(row, want_fq[0]) and torch.equal(col, want_fq[1])):
            failures.append(f"fake_quantize_both {fmt} differs from quantize + dequantize")
    print(f"fake_quantize_both check, every format: {failures or 'all equal'}")

    shapes = QUICK_SHAPES if args.quick else SHAPES
    baseline = CopyBaseline(max(m * k for m, k in shapes), dev)
    baseline.warm_up()
    # Then ~2 s of the casts themselves (and their compilation at the first shape).
    m0, k0 = shapes[0]
    x0 = torch.randn(m0, k0, device=dev, dtype=torch.bfloat16)
    warm = [run_cast(kind, x0, args.fmt, args.mode) for kind in (*TARGETS, "fake_both")]
    start = time.perf_counter()
    while time.perf_counter() - start < 2.0:
        for run in warm:
            run()
        torch.cuda.synchronize()
    del warm, x0

    copies = {shape: baseline.tbs(shape[0] * shape[1]) for shape in shapes}
    print("device-to-device copy of each input (CUDA graph / do_bench): " + ", ".join(
        f"{m}x{k} {g:.2f} / {e:.2f} TB/s" for (m, k), (g, e) in copies.items()))  # fmt: skip

    rows = []  # (shape, cast, tile, ms, TB/s, / copy, / copy do_bench, host us, target, swept)

    def timed(shape, name, label, fn, nbytes, target=None) -> float:
        """Time ``fn`` both ways, add its row, return its CUDA-graph ratio to copy."""
        (graph, events), (copy_graph, copy_events) = graph_and_bench_ms(fn), copies[shape]
        bw = nbytes / graph / 1e9
        ratio, ratio_events = bw / copy_graph, nbytes / events / 1e9 / copy_events
        rows.append((f"{shape[0]}x{shape[1]}", name, label, graph, bw, ratio, ratio_events,
                     _host_us(fn), target, "-"))  # fmt: skip
        return ratio

    compiled_ref = torch.compile(lambda x: mx_core.quantize(x, args.fmt, scale_mode=args.mode))
    for m, k in shapes:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        for kind in (*TARGETS, "fake_rowwise", "fake_colwise", "fake_both", MIXED_KIND):
            nbytes = cast_bytes(kind, m, k, 2)
            default_out = [
                t.clone() for t in run_cast(kind, x, args.fmt, args.mode)() if t is not None
            ]
            swept = []  # (ratio, label) of each swept tile, the default's first
            for tile in [None] + (SWEEP[kind] if args.sweep and not args.quick else []):
                label = str(CastTile(*(tile or TILE_CONFIGS[kind])))
                run = run_cast(kind, x, args.fmt, args.mode, tile)
                try:
                    if tile is not None:  # every swept tile computes the checked default's bits
                        out = [t for t in run() if t is not None]
                        if not all(same_bits(o, d) for o, d in zip(out, default_out, strict=True)):
                            failures.append(f"{kind} tile {tile} differs from the default tile")
                            print(f"  FAILED {kind} tile {tile}: differs from the default tile")
                            continue
                        graph, _ = graph_and_bench_ms(run)
                        ratio = nbytes / graph / 1e9 / copies[(m, k)][0]
                    else:  # the default tile's row; targets are judged on it
                        ratio = timed((m, k), kind, label, run, nbytes, TARGETS.get(kind))
                except Exception as e:  # e.g. out of shared memory: a result, not the end
                    print(f"  {kind:12s} {m}x{k} tile {tile}: {type(e).__name__}: {e}"[:300])
                    continue
                if args.sweep:
                    print(f"  {kind:12s} {m}x{k} tile {label}: {ratio:.3f} of copy (CUDA graph)")
                swept.append((ratio, label))
            if len(swept) > 1 and rows[-1][1] == kind:
                best = max(swept)
                rows[-1] = (*rows[-1][:-1], f"{best[1]}: {best[0]:.3f}")
        nbytes = cast_bytes("rowwise", m, k, 2)  # the context rows move a rowwise cast's bytes
        timed((m, k), "rowwise, fp32 rounding path (interpreter's)", "default",
              run_cast("rowwise", x, args.fmt, args.mode, hw_round=False), nbytes)  # fmt: skip
        timed((m, k), "rowwise, torch.compile(mx_core.quantize)", "-",
              lambda x=x: compiled_ref(x), nbytes)  # fmt: skip
        # The inverse, as scaled_mm's dequant_bf16 design runs it: same bytes, bf16 written.
        q, s = mx_kernels.quantize_rowwise(x, args.fmt, scale_mode=args.mode)
        timed((m, k), "dequantize_rowwise -> bf16", "-",
              lambda q=q, s=s: mx_kernels.dequantize_rowwise(q, s, args.fmt), nbytes)  # fmt: skip

    note = (
        "/ copy: TB/s over a device-to-device copy of the same input, timed the same way in "
        "the same run (CUDA graph: "
        + ", ".join(f"{m}x{k} {g:.2f}" for (m, k), (g, _) in copies.items())
        + " TB/s; do_bench: "
        + ", ".join(f"{m}x{k} {e:.2f}" for (m, k), (_, e) in copies.items())
        + f" TB/s); {args.fmt}, scale mode {args.mode}, bf16 in. ms, TB/s and targets: CUDA "
        "graph; host us: Python launch time per call"
    )
    header = ["shape", "cast", "default tile", "ms", "TB/s", "/ copy", "/ copy, do_bench",
              "host us", "target", "best swept tile: / copy"]  # fmt: skip
    table = []
    for shape, kind, label, ms, bw, ratio, ratio_ev, host, target, swept in rows:
        verdict = (
            "-" if target is None else f"{target:.2f} {'met' if ratio >= target else 'MISSED'}"
        )
        table.append((shape, kind, label, f"{ms:.3f}", f"{bw:.2f}", f"{ratio:.3f}",
                      f"{ratio_ev:.3f}", f"{host:.0f}", verdict, swept))  # fmt: skip
    publish(f"{note}\n\n{md_table(header, table)}", "casts.md")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
