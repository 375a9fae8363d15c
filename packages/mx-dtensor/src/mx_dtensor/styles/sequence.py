"""``MXSequenceParallel``: PyTorch's ``SequenceParallel`` with a check, before each
forward, that every rank's sequence shard holds whole MX blocks of tokens."""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import SequenceParallel

from mx_dtensor.styles.common import check_tokens

__all__ = ["MXSequenceParallel"]


def _check_input(style: str, seq_dim: int, bs: int, mesh: DeviceMesh, module, args) -> None:
    if args:
        check_tokens(style, module, args[0], seq_dim, bs, mesh)


class MXSequenceParallel(SequenceParallel):
    """``SequenceParallel`` (parameters replicated, input and output ``Shard(sequence_dim)``)
    for a module whose MX linears run on the sequence shard itself (replicated weights,
    tokens split across ranks): their inputs' columnwise casts (for dW) block along the
    tokens, so each rank's shard must hold a multiple of ``block_size`` of them.

    Not needed in front of a gather to ``Replicate()`` (torchtitan's plan: the norms
    before attention and the MLP), where the linears see the whole sequence: use
    ``SequenceParallel`` there. Recipes with a high-precision dW need no token blocks.

    Keyword Args:
        sequence_dim: the sequence dim of the input (default 1).
        use_local_output: return a plain local tensor (default False).
        block_size: the linears' MX block size.

    Raises (at each forward, from shapes only):
        ValueError: tokens per rank not a multiple of ``block_size``; the message names
            the module, the sizes and the padding of the sequence that fixes it.
    """

    def __init__(
        self, *, sequence_dim: int = 1, use_local_output: bool = False, block_size: int = 32
    ) -> None:
        super().__init__(sequence_dim=sequence_dim, use_local_output=use_local_output)
        # Kept here too: PyTorch's style stores it under names that changed across versions.
        self.sequence_dim, self.block_size = sequence_dim, block_size

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        # Registered first, so it sees the input before SequenceParallel's own hook
        # redistributes it.
        check = partial(
            _check_input, type(self).__name__, self.sequence_dim, self.block_size, device_mesh
        )
        module.register_forward_pre_hook(check)
        return super()._apply(module, device_mesh)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sequence_dim={self.sequence_dim}, "
            f"use_local_output={self.use_local_output}, block_size={self.block_size})"
        )
