"""Reproducer: the fused fp4 cast (``both``) of an fp32 x strided along K on the GPU.

The full bit-exact check on the H200 (triton 3.6) found wrong columnwise codes
and scales for fp4_e2m1 ``both`` from ``x.t()`` of a contiguous fp32 tensor, while the
same kernel was exact from contiguous inputs, from bf16, and for fp6/fp8
(docs/benchmark-log.md, 2026-12-03 'Casts: word stores'). ``mx_kernels.quantize_both``
therefore casts a contiguous copy in that case. This script launches the kernel
directly (no copy) for several tiles, input dtypes and layouts, and prints the wrong
bytes per output, so that the cause can be found and the copy removed once every line
reads 0.

No target. Usage (GPU): python3 tools/bench/diagnostics/repro_both_fp4.py
CPU smoke run (PYTHONPATH as run_all.sh sets it):
  TRITON_INTERPRET=1 python3 tools/bench/diagnostics/repro_both_fp4.py --device cpu --shape 64x96
"""

from __future__ import annotations

import argparse

import torch

import mx_core
import mx_kernels
from mx_kernels.cast_launch import TILE_CONFIGS, CastTile, empty_both, launch_cast

# CastTile fields: block_m, block_k, warps, programs_per_sm, stages, k_first, max_regs,
# lanes_m, words. None: the default "both" tile.
TILES = [
    None,
    (128, 64, 4, 0, 1, False, 96, 8),  # M first
    (128, 64, 4, 0, 1, True, 0, 8),  # no register cap
    (128, 64, 4, 0, 1, True, 96),  # rows not permuted
    (128, 64, 4, 0, 1, True),
    (32, 128, 2, 0, 1, True),  # the 2026-12-02 default
    (32, 128, 1),
]


def wrong_bytes(x: torch.Tensor, fmt: str, tile) -> tuple[list[int], str]:
    """Wrong bytes in (q_row, s_row, q_col, s_col) against mx_core, and where the first
    wrong q_col/s_col bytes are (row, column of x^T's outputs)."""
    f = mx_core.get_format(fmt)
    rows, cols = mx_core.quantize(x, fmt), mx_core.quantize(x.t().contiguous(), fmt)
    q_row, s_row_buf, q_col, s_col_buf = empty_both(x.shape, f, 32, x.device)
    for t in (q_row, s_row_buf, q_col, s_col_buf):
        t.view(torch.uint8).fill_(0xAB)  # unwritten bytes show as wrong
    launch_cast(x, f, 32, "rceil", q_row, s_row_buf.t(), q_col, s_col_buf, tile=tile)
    pairs = [
        (q_row, rows.qdata),
        (s_row_buf.t(), rows.scale),
        (q_col, cols.qdata),
        (s_col_buf.t(), cols.scale),
    ]
    bad = [(got.view(torch.uint8) != want.view(torch.uint8)) for got, want in pairs]
    where = " ".join(
        f"{name} first {b.nonzero()[:2].tolist()}"
        for name, b in (("q_col", bad[2]), ("s_col", bad[3]))
        if b.any()
    )
    return [int(b.sum()) for b in bad], where


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", default="544x1056", help="x's shape before the transpose")
    args = p.parse_args(argv)
    m, k = (int(n) for n in args.shape.split("x"))
    g = torch.Generator(device=args.device).manual_seed(0)
    rnd = torch.randn(m, k, device=args.device, generator=g)
    rnd = rnd * torch.exp2(torch.randint(-12, 12, (m, 1), device=args.device, generator=g))
    print(f"wrong bytes in q_row / s_row / q_col / s_col; x^T of {m}x{k} is 'K-strided'")
    failing = 0
    for fmt, dtype in (("fp4_e2m1", torch.float32), ("fp4_e2m1", torch.bfloat16)):
        for layout in ("K-strided", "contiguous"):
            x = rnd.to(dtype).t() if layout == "K-strided" else rnd.to(dtype)
            for tile in TILES:
                counts, where = wrong_bytes(x, fmt, tile)
                failing += any(counts)
                label = str(CastTile(*(tile or TILE_CONFIGS["both"])))
                dt = str(dtype).removeprefix("torch.")
                print(f"{fmt} {dt} {layout:10s} {label}: {counts} {where}".rstrip(), flush=True)
    # The fused fake-quantize cast (MXLinear's sm90 path, its own tile) on the same inputs,
    # every format: not covered by casts.py's full check.
    for fmt in mx_core.FORMAT_NAMES:
        for dtype in (torch.float32, torch.bfloat16):
            x = rnd.to(dtype).t()
            row, col = mx_kernels.fake_quantize_both(x, fmt, backend="triton")
            want = [mx_core.quantize(x, fmt, dim=d).dequantize(x.dtype) for d in (-1, 0)]
            wrong = [int((a != w).sum()) for a, w in zip((row, col), want, strict=True)]
            failing += any(wrong)
            dt = str(dtype).removeprefix("torch.")
            print(f"fake_quantize_both {fmt} {dt} K-strided: wrong values row / col {wrong}")
    print(f"{failing} failing cases")
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
