"""Shared pieces of the benchmarks: print a markdown table and keep a copy under $OUT
(the device tool brings files written there back); wall time per call of queued calls."""

from __future__ import annotations

import os
import time
from pathlib import Path


def publish(table: str, filename: str) -> None:
    """Print ``table``; also write it to ``$OUT/filename`` when OUT is set."""
    print("\n" + table)
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / filename
        path.write_text(table + "\n")
        print(f"wrote {path}")


def wall_per_call(fn, calls: int, warmup: int, rounds: int = 3) -> float:
    """Seconds per call of ``fn``: the best of ``rounds`` rounds of ``calls`` calls queued
    back to back (CUDA synchronized at the end of each round, where there is CUDA),
    after ``warmup`` calls. Host and GPU together: where the host's launch path is
    slower than the kernels, this is the host's time."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best
