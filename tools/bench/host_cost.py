"""Host time per call of every cast and fake-quantize op (run on a GPU).

Wall time per call of N calls queued back to back on a small bf16 tensor (256x1024: the
kernels take a few microseconds, so the GPU waits for the host and the figure is the
launch path). Each op is timed through its public function, through its op
(``torch.ops.mx.*``: dispatch plus the op body), through the op body alone, and its
kernel launch alone (outputs given); the dispatch and the wrapper are the differences.
torch's ``copy_`` and ``x * 2`` in the same run are the yardstick.

Target: <= 20 us per call through the public function, eager.

``--check`` first runs each op on CUDA tensors of awkward shapes, strides and
alignments twice (the compiled kernel's first launch, then the cached one) with
``MX_KERNELS_CHECK_LAUNCH=1`` semantics and compares the bits with mx-core's reference.

Usage: python tools/bench/host_cost.py [--check] [--calls 2000]
Writes the table to $OUT/host_cost.md too when OUT is set.
"""

from __future__ import annotations

import argparse
import sys

import torch
from report import publish, wall_per_call

import mx_core
import mx_kernels
from mx_core.testing import assert_same_bits
from mx_kernels import cast as C
from mx_kernels import cast_launch as L
from mx_kernels import fake_quant as FQ
from mx_kernels import launch

TARGET_US = 20.0
FMT, BS, MODE = "fp8_e4m3", 32, "rceil"


def per_call(fn, calls: int) -> float:
    """Microseconds per call (:func:`report.wall_per_call`)."""
    return wall_per_call(fn, calls, warmup=50) * 1e6


def layers(x: torch.Tensor):
    """Per op: (public call, op call, body call, launch call) closures."""
    f = mx_core.get_format(FMT)
    q, s = L._empty_cast(x.shape, f, BS, x.device)
    q_t, s_t = L._empty_cast_t(x.shape, f, BS, x.device)
    qr, sr, qc, sc = L._empty_both(x.shape, f, BS, x.device)
    row, col = torch.empty_like(x), torch.empty_like(x)
    args = (x, FMT, BS, MODE, "auto")
    return {
        "quantize_rowwise": (
            lambda: mx_kernels.quantize_rowwise(x),
            lambda: torch.ops.mx.quantize_rowwise(*args),
            lambda: C._quantize_rowwise_impl(*args),
            lambda: L._launch(x, f, BS, MODE, q, s, None, None),
        ),
        "quantize_colwise": (
            lambda: mx_kernels.quantize_colwise(x),
            lambda: torch.ops.mx.quantize_colwise(*args),
            lambda: C._quantize_colwise_impl(*args),
            lambda: L._launch(x, f, BS, MODE, None, None, q_t, s_t),
        ),
        "quantize_both": (
            lambda: mx_kernels.quantize_both(x),
            lambda: torch.ops.mx.quantize_both(*args),
            lambda: C._quantize_both_impl(*args),
            lambda: L._launch(x, f, BS, MODE, qr, sr.t(), qc, sc),
        ),
        "fake_quantize_rowwise": (
            lambda: mx_kernels.fake_quantize_rowwise(x),
            lambda: torch.ops.mx.fake_quantize_rowwise(*args),
            lambda: FQ._fake_quantize_rowwise_impl(*args),
            lambda: L._launch(x, f, BS, MODE, row, None, None, None, dequantized=True),
        ),
        "fake_quantize_colwise": (
            lambda: mx_kernels.fake_quantize_colwise(x),
            lambda: torch.ops.mx.fake_quantize_colwise(*args),
            lambda: FQ._fake_quantize_colwise_impl(*args),
            lambda: L._launch(x, f, BS, MODE, None, None, col, None, dequantized=True),
        ),
        "fake_quantize_both": (
            lambda: mx_kernels.fake_quantize_both(x),
            lambda: torch.ops.mx.fake_quantize_both(*args),
            lambda: FQ._fake_quantize_both_impl(*args),
            lambda: L._launch(x, f, BS, MODE, row, None, col, None, dequantized=True),
        ),
    }


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
    p.add_argument("--calls", type=int, default=2000, help="calls per timing round")
    p.add_argument("--quick", action="store_true", help="500 calls per round")
    p.add_argument("--profile", action="store_true", help="cProfile 500 quantize_rowwise calls")
    a = p.parse_args()
    calls = 500 if a.quick else a.calls
    ok = check() if a.check else True
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    copy_us = per_call(lambda: y.copy_(x), calls)
    mul_us = per_call(lambda: x * 2, calls)
    rows = [
        "| op | public | op (dispatch + body) | body | launch | dispatch | wrapper | target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    missed = []
    for name, fns in layers(x).items():
        public, op, body, launch_ = (per_call(fn, calls) for fn in fns)
        met = public <= TARGET_US
        missed += [] if met else [name]
        rows.append(
            f"| {name} | {public:.1f} | {op:.1f} | {body:.1f} | {launch_:.1f} | "
            f"{op - body:.1f} | {public - op:.1f} | {'met' if met else 'MISSED'} |"
        )
    rows.append(f"\nus per call; torch copy_ {copy_us:.1f}, x * 2 {mul_us:.1f} in the same run.")
    rows.append(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    publish("\n".join(rows), "host_cost.md")
    if a.profile:
        import cProfile
        import pstats

        with cProfile.Profile() as prof:
            for _ in range(500):
                mx_kernels.quantize_rowwise(x)
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
