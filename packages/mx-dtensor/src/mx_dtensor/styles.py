"""Tensor-parallel styles that communicate in MX: ``PrepareMXModuleInput``.

Sequence parallelism gathers each MLP's and attention's input from ``Shard(1)`` (tokens
split across ranks) to ``Replicate()`` once for all its columnwise linears. Here each
rank casts its local shard rowwise (blocks along the hidden dim, the last one) and the
all-gather moves the fp8 codes and E8M0 scales (as uint8: 1 + 1/32 bytes an element,
0.516x bf16), which every rank then decodes.

Why the forward stays exact: the blocks of a rowwise cast lie along the hidden dim, so
casting a sequence shard gives the rows the cast of the gathered tensor would; and an MX
linear casting the decoded values again along the same blocks gets the same values back
(``tests/test_styles_mx.py`` checks both, every scale mode). So the linears compute the
same outputs as with a high-precision gather.

Backward: the gather's gradient is reduce-scattered in the gradient's dtype (partial sums
need it), as PyTorch's sequence parallelism does. dW = dY^T X of each linear casts the
X it saved, here the decoded gathered input, along the tokens (columnwise): a second
cast of once-rounded values, so dW differs from the high-precision gather's by MX
rounding (the linears save what they would save anyway: no extra activation memory; no
all-gather in backward). The other collectives of a block (the rowwise outputs'
reduce-scatter and its backward all-gather) stay in high precision.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.distributed.tensor.parallel import PrepareModuleInput

import mx_kernels

__all__ = ["PrepareMXModuleInput", "mx_all_gather"]


# torch 2.13 renamed these (same arguments); 2.11 has only the old names.
_all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
_reduce_scatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)


def _wait(t: torch.Tensor) -> torch.Tensor:
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


class _MXAllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mesh, dim, fmt, block_size, scale_mode, backend):
        qdata, scale = mx_kernels.quantize_rowwise(
            x, fmt, block_size=block_size, scale_mode=scale_mode, backend=backend
        )
        # gloo refuses float8 dtypes: the payload travels as bytes.
        codes = _wait(_all_gather(qdata.view(torch.uint8), dim, mesh))
        scales = _wait(_all_gather(scale.view(torch.uint8), dim, mesh))
        ctx.mesh, ctx.dim = mesh, dim
        return mx_kernels.dequantize_rowwise(
            codes.view(qdata.dtype), scales.view(scale.dtype), fmt,
            block_size=block_size, out_dtype=x.dtype, backend=backend,
        )  # fmt: skip

    @staticmethod
    def backward(ctx, grad):
        dim = ctx.dim
        out = _reduce_scatter(grad.contiguous(), "sum", dim, ctx.mesh)
        return _wait(out), None, None, None, None, None, None


def mx_all_gather(
    x: torch.Tensor,
    mesh: DeviceMesh,
    dim: int,
    *,
    fmt: str = "fp8_e4m3",
    block_size: int = 32,
    scale_mode: str = "rceil",
    backend: str = "auto",
) -> torch.Tensor:
    """All-gather the local shards ``x`` [..., K] along ``dim`` over a 1-D ``mesh`` as a
    rowwise MX cast (codes + E8M0 scales), decoded to ``x.dtype`` after the gather.

    ``dim`` must not be the last one (the blocks run along it); K divisible by
    ``block_size``. Backward: reduce-scatter of the gradient along ``dim`` in its dtype.
    """
    dim = dim % x.ndim
    if dim == x.ndim - 1:
        raise ValueError(f"mx_all_gather: dim={dim} is the blocked (last) dim of {tuple(x.shape)}")
    if mesh.ndim != 1:
        raise ValueError(f"mx_all_gather needs a 1-D mesh, got {mesh.ndim}-D")
    return _MXAllGather.apply(x, mesh, dim, fmt, block_size, scale_mode, backend)


class PrepareMXModuleInput(PrepareModuleInput):
    """``PrepareModuleInput`` whose ``Shard(d) -> Replicate()`` redistributions of
    floating-point inputs run as :func:`mx_all_gather` (other layouts as PyTorch's).

    Same arguments as ``PrepareModuleInput``, plus the MX cast of the gathered input
    (use the consuming linears' ``input_fmt``, ``block_size`` and ``scale_mode`` so the
    gather changes none of their forward values). The gathered inputs stay DTensors
    (``use_local_output=False`` only): a plain local tensor would lose whether its
    gradient is a partial sum, which the gather's reduce-scatter relies on.

    Raises:
        ValueError: ``use_local_output=True``.
    """

    def __init__(
        self,
        *,
        input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        desired_input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        input_kwarg_layouts: dict[str, Placement] | None = None,
        desired_input_kwarg_layouts: dict[str, Placement] | None = None,
        use_local_output: bool = False,
        fmt: str = "fp8_e4m3",
        block_size: int = 32,
        scale_mode: str = "rceil",
        backend: str = "auto",
    ) -> None:
        if use_local_output:
            raise ValueError(
                "PrepareMXModuleInput: use_local_output=True is not supported (the gathered "
                "input must stay a DTensor so its partial-sum gradient is reduce-scattered once)"
            )
        super().__init__(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_output,
        )
        self.fmt, self.block_size, self.scale_mode, self.backend = (
            fmt, block_size, scale_mode, backend,
        )  # fmt: skip

    def _prepare_input_arg(self, input, mesh, input_layout, desired_layout):
        mx = (
            isinstance(input_layout, Shard)
            and isinstance(desired_layout, Replicate)
            and isinstance(input, torch.Tensor)
            and input.is_floating_point()
        )
        if not mx:
            return super()._prepare_input_arg(input, mesh, input_layout, desired_layout)
        local = input.to_local() if isinstance(input, DTensor) else input
        device_type = local.device.type
        if torch.is_autocast_enabled(device_type):
            # The consuming linears cast their input to the autocast dtype before their
            # MX cast (as F.linear would): cast the same values here, or the gather's
            # cast of the higher-precision values would differ from theirs.
            local = local.to(torch.get_autocast_dtype(device_type))
        out = mx_all_gather(
            local, mesh, input_layout.dim, fmt=self.fmt, block_size=self.block_size,
            scale_mode=self.scale_mode, backend=self.backend,
        )  # fmt: skip
        # The consumers' gradients are partial sums (a columnwise linear's dX): they pass
        # through as they are, and the gather's backward reduce-scatters them.
        return DTensor.from_local(
            out, mesh, (Replicate(),), run_check=False, grad_placements=(Partial(),)
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_layouts={self.input_layouts}, "
            f"desired_input_layouts={self.desired_input_layouts}, "
            f"input_kwarg_layouts={self.input_kwarg_layouts}, "
            f"desired_input_kwarg_layouts={self.desired_input_kwarg_layouts}, "
            f"use_local_output={self.use_local_output}, fmt={self.fmt!r}, "
            f"block_size={self.block_size}, scale_mode={self.scale_mode!r})"
        )
