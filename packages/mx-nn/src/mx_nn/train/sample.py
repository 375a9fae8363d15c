"""Greedy byte-level sampling from a trained model."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["greedy"]


@torch.no_grad()
def greedy(
    model: nn.Module, prompt: bytes, n: int, *, max_seq_len: int, autocast: bool = True
) -> bytes:
    """Continue a prompt greedily, byte by byte.

    Args:
        model: a byte-level language model ([batch, seq] int64 ids -> [batch, seq, 256]
            logits).
        prompt: the bytes to continue (at least one).
        n: bytes to add.
        max_seq_len: the window of bytes each prediction sees (the last ones).
        autocast: run under bf16 autocast, on the model's device.
    Returns:
        ``prompt`` followed by ``n`` bytes, each the most likely next byte.
    """
    device = next(model.parameters()).device
    tokens = torch.tensor(list(prompt), dtype=torch.long, device=device)[None]
    for _ in range(n):
        with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            logits = model(tokens[:, -max_seq_len:])
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return bytes(tokens[0].tolist())
