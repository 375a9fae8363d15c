"""Shared output of the benchmarks: print a markdown table and keep a copy under $OUT
(the device tool brings files written there back)."""

from __future__ import annotations

import os
from pathlib import Path


def publish(table: str, filename: str) -> None:
    """Print ``table``; also write it to ``$OUT/filename`` when OUT is set."""
    print("\n" + table)
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / filename
        path.write_text(table + "\n")
        print(f"wrote {path}")
