"""A norm over all heads of a projection that tensor parallelism splits by heads.

OLMo2 normalises the whole query (and key) projection output: ``q_norm`` is an RMSNorm
of width ``n_heads * head_dim`` applied to ``q_proj``'s output, which a columnwise split
leaves as this rank's heads only (a plain local tensor, ``Shard(-1)``). Run locally,
the norm's mean square would cover this rank's heads alone. :class:`HeadShardedNorm`
runs the module's own forward in DTensor instead: its weight split along its width
(``Shard(0)``, the same heads as the projection's rows), the input wrapped as the
``Shard(-1)`` DTensor it is, so the mean over the split width becomes a partial mean
all-reduced across the ranks (one ``[tokens, 1]`` all-reduce); the output goes back to
this rank's local heads. Backward is DTensor's: the weight's gradient stays
``Shard(0)``, and the input's gradient arrives through one reduce-scatter of a
``[tokens, width]`` tensor (DTensor expands the partial gradient of the mean before it
reduces it).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["HeadShardedNorm", "across_heads"]


def across_heads(norm: nn.Module, projection: nn.Linear) -> bool:
    """Whether every parameter of ``norm`` is 1-D over the whole output of
    ``projection``: a norm over all its heads (OLMo2's ``q_norm``), not one per head.

    Args:
        norm: the norm module (its parameters, e.g. an RMSNorm's ``weight``).
        projection: the linear whose output it normalises.

    Returns:
        True where ``norm`` has parameters and each is ``[projection.out_features]``.
    """
    params = list(norm.parameters())
    return bool(params) and all(
        t.ndim == 1 and t.numel() == projection.out_features for t in params
    )


class HeadShardedNorm(ParallelStyle):
    """A norm whose input is a projection's output split by heads along the last dim
    (``Shard(-1)``, a plain local tensor), computed over the whole width (module doc).

    The norm's parameters must be 1-D over that width (an RMSNorm's ``weight``): each
    is split ``Shard(0)`` like the projection's rows. Any norm whose forward works
    along the last dim is computed exactly, since DTensor runs the module's own code.

    Example::

        plan = {"layers.*.self_attn.q_proj": ColwiseParallel(),
                "layers.*.self_attn.q_norm": HeadShardedNorm()}
    """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def partition(_name, mod, mesh):
            for name, p in list(mod.named_parameters(recurse=False)):
                split = nn.Parameter(distribute_tensor(p, mesh, [Shard(0)]), p.requires_grad)
                mod.register_parameter(name, split)

        def input_fn(_mod, inputs, mesh):
            x, *rest = inputs
            return (DTensor.from_local(x, mesh, [Shard(x.ndim - 1)], run_check=False), *rest)

        def output_fn(_mod, out, mesh):
            return out.redistribute(placements=[Shard(out.ndim - 1)]).to_local()

        return distribute_module(module, device_mesh, partition, input_fn, output_fn)
