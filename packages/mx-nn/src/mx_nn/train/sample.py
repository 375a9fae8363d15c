"""Greedy byte-level sampling from a trained model."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["greedy"]


@torch.no_grad()
def greedy(
    model: nn.Module, prompt: bytes, n: int, *, max_seq_len: int, autocast: bool = True
) -> bytes:
    """``prompt`` followed by ``n`` bytes, each the most likely next byte given the last
    ``max_seq_len`` (bf16 autocast, on the model's device)."""
    device = next(model.parameters()).device
    tokens = torch.tensor(list(prompt), dtype=torch.long, device=device)[None]
    for _ in range(n):
        with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            logits = model(tokens[:, -max_seq_len:])
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return bytes(tokens[0].tolist())
