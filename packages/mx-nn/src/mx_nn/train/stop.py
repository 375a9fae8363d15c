"""Ctrl-C and SIGTERM during a run: asked to stop, the run finishes what it is doing (a
step, a save, the report's current part), then stops where that leaves a complete
checkpoint; a second Ctrl-C interrupts at once."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from torch.distributed.device_mesh import DeviceMesh

from mx_nn.train.distributed import max_over_ranks

__all__ = ["INTERRUPTED", "StopFlag"]

INTERRUPTED = 130
"""Exit status of a run stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report
Ctrl-C)."""


class StopFlag:
    """Whether SIGINT/SIGTERM asked the run to stop. Handlers are installed while
    :meth:`installed` is entered (main thread only); the first signal sets
    :attr:`requested`, a second SIGINT raises KeyboardInterrupt where the run is."""

    def __init__(self) -> None:
        self.requested = False

    def _handler(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        """Handle SIGINT and SIGTERM inside the block (the old handlers come back after)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def agreed(self, mesh: DeviceMesh | None) -> bool:
        """Whether any rank was asked to stop (a collective on a mesh: every rank calls it
        at the same point, so all stop there together)."""
        return max_over_ranks(float(self.requested), mesh) > 0
