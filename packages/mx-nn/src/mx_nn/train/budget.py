"""How much memory a training step's activations need, so that a ``--seq``/``--batch``
far beyond the machine is refused up front instead of being OOM-killed mid-run.

The model has no learned positions (RoPE), so nothing else bounds ``--seq``: the limit
is memory. Attention runs through ``scaled_dot_product_attention`` (flash kernels on CPU
and CUDA), so activations grow linearly with tokens. Measured on CPU (torch 2.13, one
step under bf16 autocast, ``test_budget.py`` checks it): about 9.3 KB per token per
block at dim 128 / FFN 384, about 17 KB at dim 256 / FFN 768, plus about 3.3 KB per
token for the 256-way logits and the loss. That fit is one machine's: the same step of
the default model took 26.8 KB per token on an AVX-512 EPYC and 15.3 KB on the CI
machine (0.70 of the fit; CPU kernels keep different temporaries). :func:`step_bytes`
is half the fit: a lower bound on both, so that only runs that cannot fit are refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["VOCAB", "available_bytes", "per_token_bytes", "step_bytes"]

VOCAB = 256
_LOWER = 0.5  # the fit times this: below the least measured (0.70 of the fit)


def per_token_bytes(dim: int, hidden: int, layers: int, tp: int = 1) -> float:
    """Activation bytes per token of one training step (the fit, not the lower bound).

    Args:
        dim: the model width.
        hidden: the FFN's hidden width.
        layers: transformer blocks.
        tp: the tensor-parallel degree, which divides the per-block widths (shards).
    Returns:
        Bytes per token, on one rank.
    """
    return 4 * (layers * (6 * dim + 4 * hidden) / tp + 3.25 * VOCAB)


def step_bytes(*, dim: int, hidden: int, layers: int, tokens: int, tp: int = 1) -> int:
    """A lower bound on the activation memory of one step.

    Args:
        dim, hidden, layers, tp: as :func:`per_token_bytes`.
        tokens: tokens of the step on one device (sequences times ``--seq``).
    Returns:
        Bytes: half of ``tokens`` times :func:`per_token_bytes` (module doc).
    """
    return int(_LOWER * tokens * per_token_bytes(dim, hidden, layers, tp))


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def available_bytes(device: torch.device) -> tuple[int, str]:
    """The memory a run on ``device`` can use at most.

    Args:
        device: the run's device (CUDA: ``index`` None means device 0).
    Returns:
        ``(bytes, what)``: one CUDA device's total memory, or on CPU the host's RAM (or the
        container's cgroup limit, if lower), and how a message names it.
    """
    if device.type == "cuda":
        index = device.index if device.index is not None else 0
        return torch.cuda.get_device_properties(index).total_memory, f"{device} memory"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit()
    if limit is not None and limit < ram:
        return limit, "memory (the container's limit)"
    return ram, "RAM"
