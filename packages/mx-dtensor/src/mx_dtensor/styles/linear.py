"""``MXColwiseParallel`` and ``MXRowwiseParallel``: PyTorch's linear styles for MX
linears, checked at apply time for whole MX blocks per rank.

Layouts, parameters and outputs are PyTorch's (``ColwiseParallel`` shards the weight
and bias along out_features, ``RowwiseParallel`` the weight along in_features with a
Partial output reduced or reduce-scattered in its dtype: partial sums need the
precision). What they add:

- both refuse, when applied, a linear whose shards would split an MX block: each
  rank's out_features and in_features a multiple of ``block_size``;
- ``MXColwiseParallel`` given a sequence-sharded input (``input_layouts=Shard(d)``, d
  not the last dim) gathers it to ``Replicate()`` as the rowwise MX cast
  (:func:`mx_dtensor.mx_all_gather`: 0.52x the bytes of bf16, the same forward values
  for an MX linear), not in high precision.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from mx_core import CastSettings
from mx_dtensor.cast_args import CastFields, cast_from_args
from mx_dtensor.gather import gather_replicated
from mx_dtensor.styles.common import check_linear, is_last_dim, log_once

__all__ = ["MXColwiseParallel", "MXRowwiseParallel"]


def _colwise_input(
    input_layout: Placement, cast: CastSettings, who: str, mod: nn.Module, inputs, device_mesh
):
    """ColwiseParallel's input preparation, with a Shard(d) -> Replicate gathered as MX."""
    x = inputs[0]
    mx = isinstance(input_layout, Shard) and isinstance(x, torch.Tensor) and x.is_floating_point()
    if mx and is_last_dim(input_layout.dim, x.ndim):
        log_once(who, input_layout)
        mx = False
    if mx:
        return gather_replicated(x, device_mesh, input_layout.dim, cast=cast, who=who)
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, device_mesh, (input_layout,), run_check=False)
    if input_layout != Replicate():
        x = x.redistribute(placements=(Replicate(),), async_op=True)
    return x


class MXColwiseParallel(CastFields, ColwiseParallel):
    """``ColwiseParallel`` for an MX linear: weight [N, K] (and bias) sharded along N,
    input ``Replicate()``, output ``Shard(-1)`` unless ``output_layouts`` says otherwise.

    Keyword Args:
        input_layouts: layout the input arrives in (default ``Replicate()``); a
            ``Shard(d)`` with d not the last dim is gathered as the rowwise MX cast
            ``cast`` (the gradient is reduce-scattered in its dtype). ``Shard(-1)`` is
            gathered in high precision.
        output_layouts: layout of the output (default ``Shard(-1)``).
        use_local_output: return a plain local tensor (default True).
        cast: the linear's input cast (default ``CastSettings()``: fp8_e4m3, 32, rceil,
            auto), so the gather changes none of its forward values; its ``block_size``
            is the one the weight's shards must hold whole.
        fmt, block_size, scale_mode, backend: the same given one by one, deprecated
            (a FutureWarning; not together with ``cast``). Read back as attributes, as
            ever.

    Raises:
        TypeError: ``cast`` and any of the four keywords both given.
        ValueError: a cast setting CastSettings refuses.

    Raises (at ``parallelize_module``):
        ValueError: out_features per rank or in_features not a multiple of ``block_size``.
        NotImplementedError: not an ``nn.Linear`` (subclasses are).
    """

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
        cast: CastSettings | None = None,
        fmt: str | None = None,
        block_size: int | None = None,
        scale_mode: str | None = None,
        backend: str | None = None,
    ) -> None:
        who = type(self).__name__
        self.cast = cast_from_args(who, cast, fmt=fmt, block_size=block_size,
                                   scale_mode=scale_mode, backend=backend)  # fmt: skip
        super().__init__(
            input_layouts=input_layouts,
            output_layouts=output_layouts,
            use_local_output=use_local_output,
        )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        who = type(self).__name__
        check_linear(who, module, device_mesh, 0, self.cast.block_size)
        return distribute_module(
            module,
            device_mesh,
            self._partition_linear_fn,
            partial(_colwise_input, self.input_layouts[0], self.cast, who),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_layouts={self.input_layouts}, "
            f"output_layouts={self.output_layouts}, use_local_output={self.use_local_output}, "
            f"cast={self.cast!r})"
        )


class MXRowwiseParallel(RowwiseParallel):
    """``RowwiseParallel`` for an MX linear: weight [N, K] sharded along K (bias
    replicated), input ``Shard(-1)``, the Partial output reduced to ``Replicate()`` (or
    reduce-scattered to ``output_layouts``) in its dtype.

    Keyword Args:
        input_layouts: layout the input arrives in (default ``Shard(-1)``).
        output_layouts: layout of the output (default ``Replicate()``).
        use_local_output: return a plain local tensor (default True).
        block_size: the linear's MX block size.

    Raises (at ``parallelize_module``):
        ValueError: in_features per rank or out_features not a multiple of ``block_size``.
        NotImplementedError: not an ``nn.Linear`` (subclasses are).
    """

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
        block_size: int = 32,
    ) -> None:
        super().__init__(
            input_layouts=input_layouts,
            output_layouts=output_layouts,
            use_local_output=use_local_output,
        )
        self.block_size = block_size

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        check_linear(type(self).__name__, module, device_mesh, 1, self.block_size)
        return super()._apply(module, device_mesh)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_layouts={self.input_layouts}, "
            f"output_layouts={self.output_layouts}, use_local_output={self.use_local_output}, "
            f"block_size={self.block_size})"
        )
