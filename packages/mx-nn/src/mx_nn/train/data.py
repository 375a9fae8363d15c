"""Byte-level data: the built-in corpus or a ``--data`` file, a held-out split, and
batches that depend only on (seed, step), so a resumed run sees the same ones."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import torch

__all__ = ["ByteData", "load_text"]

HELDOUT_FRACTION = 0.1
"""The last tenth of the text is held out."""
MAX_HELDOUT_BATCHES = 4
"""Held-out loss averages at most this many batches of windows."""


def load_text(path: str | Path | None) -> tuple[bytes, str]:
    """The text a run trains on.

    Args:
        path: a ``--data`` file, or None for the built-in Shakespeare corpus.
    Returns:
        ``(text, name)``: its UTF-8 bytes and a name for it in messages.
    Raises:
        ValueError: the file is not UTF-8 (the message names ``--data``).
    """
    if path is None:
        corpus = resources.files("mx_nn.train") / "corpus" / "shakespeare.txt"
        return corpus.read_bytes(), "built-in Shakespeare (corpus/NOTICE.md)"
    raw = Path(path).read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--data {str(path)!r} is not UTF-8 text ({e})") from None
    return raw, str(path)


class ByteData:
    """Tokens are bytes (vocab 256). ``train`` and ``heldout`` are uint8 [n] tensors;
    ``sha256`` is the text's digest (hex), which a resumed run's text must match.

    Args:
        text: the corpus.
        seq: tokens per sequence; each window is ``seq + 1`` bytes (inputs and targets).

    Raises:
        ValueError: the text is too short for a training window and a held-out window.
    """

    def __init__(self, text: bytes, *, seq: int) -> None:
        n_heldout = max(int(len(text) * HELDOUT_FRACTION), seq + 1)
        if len(text) - n_heldout < seq + 1:  # before frombuffer, which refuses 0 bytes
            raise ValueError(
                f"--data has {len(text)} bytes; --seq {seq} needs at least {2 * (seq + 1)} "
                f"(a window of seq + 1 bytes to train on and one held out)"
            )
        data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        self.seq = seq
        self.sha256 = hashlib.sha256(text).hexdigest()  # a resumed run's --data must match
        self.train = data[:-n_heldout]
        self.heldout = data[-n_heldout:]

    def train_batch(self, step: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, int64 [batch, seq], of ``batch`` windows at offsets drawn
        from a generator seeded by (seed, step) alone."""
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.train) - self.seq, (batch,), generator=gen)
        return self._windows(self.train, starts)

    def heldout_batches(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The fixed held-out set: evenly spaced windows, at most
        ``MAX_HELDOUT_BATCHES * batch`` of them, in batches of ``batch`` (the last may be
        smaller)."""
        n = min(len(self.heldout) // (self.seq + 1), MAX_HELDOUT_BATCHES * batch)
        n = max(n, 1)
        span = len(self.heldout) - self.seq - 1
        starts = torch.linspace(0, span, n).long()
        return [self._windows(self.heldout, s) for s in starts.split(batch)]

    def _windows(self, data: torch.Tensor, starts: torch.Tensor):
        idx = starts[:, None] + torch.arange(self.seq + 1)
        w = data[idx].long()
        return w[:, :-1], w[:, 1:]
