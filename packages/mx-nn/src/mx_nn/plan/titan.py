"""torchtitan 0.3's vocabulary-parallel ``Embedding`` under the plan's embedding split.

Its forward looks rows up in the weight's local shard itself once it has a
``tp_group`` (``torchtitan/models/common/embedding.py``): it masks the ids outside its
shard and returns this rank's partial sum as a plain tensor, and torchtitan's own
sharding config reduces it. PyTorch's ``RowwiseParallel`` hands that forward a DTensor
input instead (a mixed-tensor error), so this style gives it what it expects: the
weight split along the vocabulary (``Shard(0)``, as ``RowwiseParallel`` splits an
embedding, so a tied LM head can share it), the plain ids, and the partial output
reduced to the plan's output layout.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ParallelStyle, RowwiseParallel

__all__ = ["VocabParallelEmbedding", "is_vocab_parallel_embedding"]


def is_vocab_parallel_embedding(module: nn.Module) -> bool:
    """Whether ``module`` is an embedding that does its own vocabulary-parallel lookup.

    Args:
        module: any module.
    Returns:
        True for torchtitan's: an ``nn.Embedding`` with a ``tp_group`` attribute.
    """
    return isinstance(module, nn.Embedding) and hasattr(module, "tp_group")


class VocabParallelEmbedding(ParallelStyle):
    """The embedding split of ``RowwiseParallel(input_layouts=Replicate(), ...)`` for an
    embedding that looks up its own shard (module doc).

    Args:
        output_layouts: the layout of the reduced output (``Replicate()``, or ``Shard(1)``
            with sequence parallelism: reduce-scattered).
        use_local_output: return the output's local tensor.
    """

    def __init__(self, *, output_layouts: Placement, use_local_output: bool) -> None:
        super().__init__()
        self.output_layouts = output_layouts
        self.use_local_output = use_local_output

    @classmethod
    def like(cls, style: RowwiseParallel) -> VocabParallelEmbedding:
        """The same output layouts as the plan's ``style`` for the embedding."""
        return cls(output_layouts=style.output_layouts[0], use_local_output=style.use_local_output)

    def __repr__(self) -> str:
        return (
            f"VocabParallelEmbedding(output_layouts={self.output_layouts}, "
            f"use_local_output={self.use_local_output})"
        )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def partition(_name, mod, mesh):
            w = nn.Parameter(distribute_tensor(mod.weight, mesh, [Shard(0)]))
            mod.register_parameter("weight", w)

        def output_fn(_mod, out, mesh):  # this rank's partial sums, a plain tensor
            partial = DTensor.from_local(out, mesh, [Partial()], run_check=False)
            reduced = partial.redistribute(placements=[self.output_layouts])
            return reduced.to_local() if self.use_local_output else reduced

        module.tp_group = device_mesh.get_group()
        return distribute_module(module, device_mesh, partition, output_fn=output_fn)
