"""Time edited copies of the cast kernel to see what bounds it (run on a GPU).

Each variant rewrites lines of ``mx_kernels/cast_triton.py`` (skip a store, add a cache
hint, swap the launch order), loads the copy as a module, and times the casts through
``common.run_cast`` at one shape, as a fraction of a copy of the same input (CUDA graph
timing, and do_bench beside it, as casts.py does). Variants that
skip a store compute wrong outputs on purpose; the others are checked against the
unedited kernel's bits. The benchmark log quotes these "leave-one-out" figures
(docs/benchmark-log.md, 2026-12-03 'Casts: CUDA-graph timing'). No target.

Usage (from tools/bench, PYTHONPATH as run_all.sh sets it):
  python3 diagnostics/diagnose_casts.py [--shape 16384 8192] [--variants base "no s_row store" ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/bench, for common

import torch  # noqa: E402
from common import CopyBaseline, cast_bytes, graph_and_bench_ms, run_cast, same_bits  # noqa: E402

import mx_kernels.cast_triton as cast_triton  # noqa: E402

STORE_Q_ROW = "tl.store(q_ptrs, codes, mask=q_mask)"
STORE_S_ROW = "tl.store(s_ptrs, tl.reshape(scale, (BLOCK_M, BLOCK_K // BS)), mask=s_mask)"
STORE_Q_COL = "tl.store(q_ptrs, codes_t, mask=mask_t)"
STORE_S_COL = "tl.store(s_ptrs, tl.reshape(scale, (BLOCK_M // BS, BLOCK_K)), mask=s_mask)"
LOAD = "x = tl.load(x_ptrs, mask=mask, other=0.0)"  # then .to(tl.float32)


def _hinted(line: str, hint: str) -> tuple[str, str]:
    return line, line[:-1] + f", {hint})"


# name -> (line edits, whether the outputs must keep the unedited kernel's bits)
VARIANTS: dict[str, tuple[list[tuple[str, str]], bool]] = {
    "base": ([], True),
    "no q_row store": ([(STORE_Q_ROW, "pass")], False),
    "no s_row store": ([(STORE_S_ROW, "pass")], False),
    "no q_col store": ([(STORE_Q_COL, "pass")], False),
    "no s_col store": ([(STORE_S_COL, "pass")], False),
    "no scale stores": ([(STORE_S_ROW, "pass"), (STORE_S_COL, "pass")], False),
    "stores .cs": (
        [_hinted(s, 'cache_modifier=".cs"') for s in (STORE_Q_ROW, STORE_S_ROW, STORE_Q_COL)],
        True,
    ),
    "load evict_first": ([_hinted(LOAD, 'eviction_policy="evict_first"')], True),
}
KINDS = ("rowwise", "colwise", "both", "fake_both")


def load_variant(name: str, edits: list[tuple[str, str]], folder: Path):
    """The cast kernel module with ``edits`` applied, imported from ``folder``."""
    src = Path(cast_triton.__file__).read_text()
    for old, new in edits:
        if old not in src:
            raise ValueError(f"variant {name!r}: line not found in cast_triton.py: {old}")
        src = src.replace(old, new)
    path = folder / f"cast_variant_{abs(hash(name))}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs=2, default=(16384, 8192))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    args = p.parse_args(argv)
    m, k = args.shape
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    copy_graph, copy_events = CopyBaseline(m * k).ms(m * k)  # ms: CUDA graph, do_bench
    want = {kind: [t.clone() for t in run_cast(kind, x, "fp8_e4m3", "rceil")() if t is not None]
            for kind in KINDS}  # fmt: skip
    original, status = cast_triton.mx_cast_kernel, 0
    with tempfile.TemporaryDirectory() as folder:
        for name in args.variants:
            edits, exact = VARIANTS[name]
            cast_triton.mx_cast_kernel = load_variant(name, edits, Path(folder)).mx_cast_kernel
            try:
                for kind in args.kinds:
                    run = run_cast(kind, x, "fp8_e4m3", "rceil")
                    got = [t for t in run() if t is not None]
                    same = all(same_bits(a, b) for a, b in zip(got, want[kind], strict=True))
                    graph, events = graph_and_bench_ms(run)
                    bytes_vs_copy = cast_bytes(kind, m, k, 2) / (4 * x.numel())
                    ratio = bytes_vs_copy * copy_graph / graph  # bandwidth over copy's
                    ratio_events = bytes_vs_copy * copy_events / events
                    flag = "" if same or not exact else "  DIFFERS from the unedited kernel"
                    status |= bool(flag)
                    print(f"{m}x{k} {name:18s} {kind:10s} {graph:.4f} ms {ratio:.3f} of copy "
                          f"(do_bench: {ratio_events:.3f}){flag}")  # fmt: skip
            finally:
                cast_triton.mx_cast_kernel = original
    return status


if __name__ == "__main__":
    sys.exit(main())
