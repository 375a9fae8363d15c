"""MX GEMM benchmark: the Triton designs of ``mx_kernels.scaled_mm`` against cuBLAS.

For each shape (M, K, N), ``x`` [M, K] and ``w`` [N, K] are random bf16, quantized with
``mx_core.quantize`` (MXFP8 e4m3, rowwise along K) on the GPU. Measured, in one run:

- bf16 cuBLAS ``x @ w.t()`` (the baseline of every ratio),
- fp8 ``torch._scaled_mm`` with rowwise fp32 scales (the fp8 ceiling; fast accumulation
  on and off),
- each Triton design (``dot_scaled``, ``fp8_mma``, ``dequant_bf16``): every autotune
  config on its own,
  then the autotuned launcher, each checked against the emulated backend,
- ``mx_kernels.scaled_mm`` with ``backend="auto"`` (what users get),
- the cuBLAS MX GEMM where the GPU is sm100+.

Times are ``triton.testing.do_bench`` medians (L2 flushed between runs). A Triton result
more than 1e-2 (relative Frobenius error, bf16 output) from the emulated one fails the
run: exit status 1, after the table is printed. The markdown table is also written to
``$OUT/gemm.md`` when ``OUT`` is set.

Target: ``scaled_mm`` (auto: design ``dequant_bf16`` on sm90) at >= 1.0x bf16 cuBLAS's
speed (bf16 time / MX time), floor 0.85x.

Usage (from the repository root, on a GPU machine)::

    python3 tools/bench/gemm.py --designs dequant_bf16   # BENCHMARKS.md's first table
    python3 tools/bench/gemm.py            # every design, the four LLM shapes, ~2-4 min
    python3 tools/bench/gemm.py --quick    # one small shape (smoke test)
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
from common import bench_ms, environment, publish

import mx_kernels
from mx_core import quantize
from mx_kernels import capability, matmul_triton
from mx_kernels.matmul import scaled_mm_cublas, scaled_mm_reference

SHAPES = [(8192, 8192, 8192), (16384, 4096, 4096), (16384, 4096, 14336), (16384, 14336, 4096)]
QUICK_SHAPES = [(2048, 2048, 2048)]
MAX_REL_ERR = 1e-2  # against the emulated backend, bf16 output
BASELINE = "bf16 cuBLAS x @ w.t()"  # every ratio's denominator


@dataclass
class Row:
    shape: tuple[int, int, int]
    impl: str
    config: str = ""
    ms: float | None = None
    rel_err: float | None = None
    note: str = ""

    def tflops(self) -> float | None:
        m, k, n = self.shape
        return None if self.ms is None else 2 * m * n * k / (self.ms * 1e-3) / 1e12


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def _config_name(config: triton.Config) -> str:
    k = config.kwargs
    return f"{k['BLOCK_M']}x{k['BLOCK_N']}x{k['BLOCK_K']} w{config.num_warps} s{config.num_stages}"


def _measure(rows: list[Row], row: Row, fn: Callable[[], torch.Tensor], ref=None) -> None:
    """Run ``fn`` once (compile, autotune, check against ``ref``), then time it."""
    try:
        out = fn()
        torch.cuda.synchronize()
        if ref is not None:
            row.rel_err = _rel_err(out, ref)
        row.ms = bench_ms(fn)
    except Exception as e:  # a failing implementation is a result, not the end of the run
        row.note = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        traceback.print_exc()
    rows.append(row)
    print(_format_row(row, None), flush=True)


def check_dequant() -> list[str]:
    """The Triton dequantize bit-exact with ``MXTensor.dequantize`` on the GPU, and the
    dequant_bf16 design's fp32 and fp16 outputs against the emulated backend."""
    failures = []
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(544, 1056, device="cuda", generator=g)
    x = x * torch.exp2(torch.randint(-20, 20, (544, 1), device="cuda", generator=g))
    for fmt in ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1"):
        t = quantize(x, fmt)
        for dtype in (torch.bfloat16, torch.float32):
            got = mx_kernels.dequantize_rowwise(t.qdata, t.scale, fmt, out_dtype=dtype)
            if not torch.equal(got, t.dequantize(dtype)):
                failures.append(f"dequantize_rowwise {fmt} -> {dtype}")
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2**-10)):
        # fp32: rows 2^+-20 apart and a small A; fp16: plain randn, inside its range.
        y, shift = (x, 2**-20) if dtype == torch.float32 else (torch.randn_like(x), 1.0)
        a, b = quantize(y[:, :1024] * shift, "fp8_e4m3"), quantize(y[:512, :1024], "fp8_e5m2")
        args = (a.qdata, a.scale, b.qdata, b.scale)
        ref = scaled_mm_reference(*args, torch.float32)
        out = matmul_triton.scaled_mm_triton(*args, dtype, design="dequant_bf16")
        if out.dtype != dtype or _rel_err(out, ref) > tol:
            failures.append(f"dequant_bf16 -> {dtype}: rel err {_rel_err(out, ref):.2e}")
    print(f"dequantize / dequant_bf16 checks: {failures or 'all passed'}", flush=True)
    return failures


def bench_shape(m: int, k: int, n: int, fmt: str, designs: list[str]) -> list[Row]:
    shape = (m, k, n)
    rows: list[Row] = []
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    _measure(rows, Row(shape, BASELINE), lambda: x @ w.t())

    # fp8 rowwise: per-row fp32 scales of x and of w (the fp8 ceiling on sm90).
    e4m3 = torch.float8_e4m3fn
    sx = x.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
    sw = w.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
    x8, w8 = (x.float() / sx).to(e4m3), (w.float() / sw).to(e4m3)
    for fast in (False, True):
        _measure(
            rows,
            Row(shape, "fp8 rowwise torch._scaled_mm", f"fast_accum={fast}"),
            lambda fast=fast: torch._scaled_mm(
                x8, w8.t(), sx, sw.t(), out_dtype=torch.bfloat16, use_fast_accum=fast
            ),
        )

    a, b = quantize(x, fmt), quantize(w, fmt)
    args = (a.qdata, a.scale, b.qdata, b.scale)
    ref = scaled_mm_reference(*args, torch.float32)
    # The same bf16 GEMM on MX-valued operands (few mantissa bits set): the GPU's clock
    # under its power limit depends on the data, which moves the dequant_bf16 ratio.
    xq, wq = a.dequantize(torch.bfloat16), b.dequantize(torch.bfloat16)
    _measure(rows, Row(shape, "bf16 cuBLAS on the dequantized x, w"), lambda: xq @ wq.t())
    for design in designs:
        impl = f"triton {design}"
        for config in matmul_triton.configs(design):
            _measure(
                rows,
                Row(shape, impl, _config_name(config)),
                lambda d=design, c=config: matmul_triton.scaled_mm_triton(
                    *args, torch.bfloat16, design=d, config=c
                ),
                ref,
            )
        row = Row(shape, impl, "autotuned")
        _measure(
            rows,
            row,
            lambda d=design: matmul_triton.scaled_mm_triton(*args, torch.bfloat16, design=d),
            ref,
        )
        best = matmul_triton.autotuned_config(design)
        if best is not None:
            row.config = f"autotuned: {_config_name(best)}"
    _measure(
        rows,
        Row(shape, "mx_kernels.scaled_mm", "backend=auto"),
        lambda: mx_kernels.scaled_mm(*args, out_dtype=torch.bfloat16),
        ref,
    )
    # PyTorch's cuBLAS MX GEMM where mx_kernels' rules say it runs (sm100/sm103; MXFP4
    # also needs torch.nn.functional.scaled_mm and an MSLK build), not any sm >= 10.
    fp4 = fmt == "fp4_e2m1"
    gap = capability.cublas_mx_gap(
        capability.device_capability(x.device), fp4=fp4, where=str(x.device)
    )
    if gap is None:
        entry = "torch.nn.functional.scaled_mm" if fp4 else "torch._scaled_mm"
        _measure(
            rows,
            Row(shape, f"cuBLAS MX {entry}"),
            lambda: scaled_mm_cublas(*args, torch.bfloat16),
            ref,
        )
    else:
        print(f"{shape}: no cuBLAS MX row: {gap}", flush=True)
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _format_row(row: Row, bf16_ms: float | None) -> str:
    m, k, n = row.shape
    ratio = None if row.ms is None or bf16_ms is None else bf16_ms / row.ms
    cells = [
        f"{m}x{k}x{n}",
        row.impl,
        row.config,
        _fmt(row.ms, ".3f"),
        _fmt(row.tflops(), ".0f"),
        _fmt(ratio, ".2f"),
        _fmt(row.rel_err, ".1e"),
        row.note,
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(rows: list[Row], header: str) -> str:
    lines = [
        header,
        "",
        "| M x K x N | implementation | config | ms | TFLOP/s | vs bf16 | rel err | note |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    bf16 = {r.shape: r.ms for r in rows if r.impl == BASELINE}
    lines += [_format_row(r, bf16.get(r.shape)) for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small shape (smoke test)")
    parser.add_argument("--fmt", default="fp8_e4m3", help="MX element format of x and w")
    parser.add_argument(
        "--designs",
        default=",".join(matmul_triton.DESIGNS),
        help="comma-separated Triton designs to time (default: all)",
    )
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        print("gemm.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the emulated reference is exact fp32
    header = f"# MX GEMM ({opts.fmt} x {opts.fmt} -> bf16)"
    print(f"{header}: {environment()}", flush=True)
    check_failures = check_dequant()
    rows: list[Row] = []
    for m, k, n in QUICK_SHAPES if opts.quick else SHAPES:
        rows += bench_shape(m, k, n, opts.fmt, opts.designs.split(","))
        torch.cuda.empty_cache()
    publish(markdown(rows, header), "gemm.md")
    bad = [r for r in rows if r.rel_err is not None and r.rel_err > MAX_REL_ERR]
    # A single config may exceed the GPU's resources; the autotuned path must not fail.
    must_run = ("autotuned", "backend=auto")
    failed = [r for r in rows if r.note.startswith("error") and r.config.startswith(must_run)]
    for r in bad:
        print(f"FAILED: {r.impl} {r.config} at {r.shape}: rel err {r.rel_err:.2e} > {MAX_REL_ERR}")
    for r in failed:
        print(f"FAILED: {r.impl} {r.config} at {r.shape}: {r.note}")
    return 1 if bad or failed or check_failures else 0


if __name__ == "__main__":
    sys.exit(main())
