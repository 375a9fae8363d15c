"""Training progress: a tqdm bar (loss, tokens/s, ETA) on a terminal, plain periodic
lines in a pipe or log file (no carriage-return bar redrawn into a file)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

LOG_LINES = 10
"""Lines a run prints when the output is not a terminal (plus the last step)."""


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """Progress of one run of ``total`` steps that starts after ``start`` steps done.

    Args:
        desc: run name shown on each line.
        total: steps of the run.
        start: steps already done (a resumed run).
        enabled: False on every rank but the first.
        stream: where to write (default ``sys.stderr`` on a terminal, else ``sys.stdout``).
        tty: force bar (True) or lines (False); default: whether ``stream`` is a terminal.
    """

    def __init__(self, desc: str, total: int, *, start: int = 0, enabled: bool = True,
                 stream: TextIO | None = None, tty: bool | None = None) -> None:  # fmt: skip
        self.desc, self.total, self.enabled = desc, total, enabled
        out = stream or sys.stderr
        self.tty = out.isatty() if tty is None else tty
        self.stream = out if self.tty or stream is not None else sys.stdout
        self.every = max(1, total // LOG_LINES)
        self.t0, self.start = time.perf_counter(), start
        self.bar = None
        if enabled and self.tty:
            from mx_nn.train.extras import tqdm

            self.bar = tqdm(total=total, initial=start, desc=desc, file=self.stream,
                            dynamic_ncols=True, unit="step")  # fmt: skip

    def update(self, step: int, loss: float, tokens_per_s: float,
               heldout: float | None = None) -> None:  # fmt: skip
        """Step ``step`` (1-based) finished with train ``loss`` (nats/token)."""
        if not self.enabled:
            return
        if self.bar is not None:
            post = {"loss": f"{loss:.3f}", "tok/s": f"{tokens_per_s:,.0f}"}
            if heldout is not None:
                post["held-out"] = f"{heldout:.3f}"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)
            return
        if step % self.every and step != self.total:
            return
        elapsed = time.perf_counter() - self.t0
        done = step - self.start
        eta = elapsed / done * (self.total - step) if done else 0.0
        held = f" held-out {heldout:.4f}" if heldout is not None else ""
        print(f"{self.desc} step {step}/{self.total} loss {loss:.4f}{held} "
              f"tok/s {tokens_per_s:,.0f} elapsed {_clock(elapsed)} eta {_clock(eta)}",
              file=self.stream, flush=True)  # fmt: skip

    def close(self) -> None:
        """End the bar (no-op in line mode)."""
        if self.bar is not None:
            self.bar.close()
