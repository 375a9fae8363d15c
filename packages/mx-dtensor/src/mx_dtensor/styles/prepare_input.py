"""``PrepareMXModuleInput``: ``PrepareModuleInput`` whose sequence gathers move MX."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor.parallel import PrepareModuleInput

from mx_core import CastSettings
from mx_dtensor.cast_args import CastFields, cast_from_args
from mx_dtensor.gather import gather_replicated
from mx_dtensor.styles.common import is_last_dim, log_once

__all__ = ["PrepareMXModuleInput"]


class PrepareMXModuleInput(CastFields, PrepareModuleInput):
    """``PrepareModuleInput`` whose ``Shard(d) -> Replicate()`` redistributions of
    floating-point inputs run as :func:`mx_dtensor.mx_all_gather` (other layouts as
    PyTorch's, and so does ``Shard(-1)``, the blocked dim: logged once).

    Same arguments as ``PrepareModuleInput``, plus ``cast``, the MX cast of the gathered
    input (default ``CastSettings()``: fp8_e4m3, 32, rceil, auto; use the consuming
    linears' input cast, so the gather changes none of their forward values), or,
    deprecated (a FutureWarning), its four settings given one by one (``fmt``,
    ``block_size``, ``scale_mode``, ``backend``; not together with ``cast``; still read
    back as attributes). The gathered inputs stay
    DTensors (``use_local_output=False`` only): a plain local tensor would lose whether
    its gradient is a partial sum, which the gather's reduce-scatter relies on.

    Raises:
        TypeError: ``cast`` and any of the four keywords both given.
        ValueError: ``use_local_output=True``; a cast setting CastSettings refuses.
    """

    def __init__(
        self,
        *,
        input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        desired_input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        input_kwarg_layouts: dict[str, Placement] | None = None,
        desired_input_kwarg_layouts: dict[str, Placement] | None = None,
        use_local_output: bool = False,
        cast: CastSettings | None = None,
        fmt: str | None = None,
        block_size: int | None = None,
        scale_mode: str | None = None,
        backend: str | None = None,
    ) -> None:
        if use_local_output:
            raise ValueError(
                "PrepareMXModuleInput: use_local_output=True is not supported (the gathered "
                "input must stay a DTensor so its partial-sum gradient is reduce-scattered once)"
            )
        self.cast = cast_from_args(type(self).__name__, cast, fmt=fmt, block_size=block_size,
                                   scale_mode=scale_mode, backend=backend)  # fmt: skip
        super().__init__(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_output,
        )

    def _prepare_input_arg(self, input, mesh, input_layout, desired_layout):
        mx = (
            isinstance(input_layout, Shard)
            and isinstance(desired_layout, Replicate)
            and isinstance(input, torch.Tensor)
            and input.is_floating_point()
        )
        if mx and is_last_dim(input_layout.dim, input.ndim):
            log_once(type(self).__name__, input_layout)
            mx = False
        if not mx:
            return super()._prepare_input_arg(input, mesh, input_layout, desired_layout)
        return gather_replicated(
            input, mesh, input_layout.dim, cast=self.cast, who=type(self).__name__
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_layouts={self.input_layouts}, "
            f"desired_input_layouts={self.desired_input_layouts}, "
            f"input_kwarg_layouts={self.input_kwarg_layouts}, "
            f"desired_input_kwarg_layouts={self.desired_input_kwarg_layouts}, "
            f"use_local_output={self.use_local_output}, cast={self.cast!r})"
        )
