"""How an :class:`mx_nn.MXLinear` reads FSDP's gathered MX cast of its weight
(:class:`mx_nn.fsdp.weight.MXGatheredWeight`) in place of casting the weight: the
rowwise cast in forward, the columnwise one in backward, as the casts of
``mx_kernels`` would return them for the whole weight (codes and scales, or their
dequantized values for the fused path), as DTensors with the weight's placements for a
tensor-parallel weight. Each checks that the gather moved the cast the pass needs.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Shard

import mx_kernels
from mx_nn.config import MXLinearConfig
from mx_nn.fsdp.weight import MXGatheredWeight

__all__ = ["colwise", "colwise_dequantized", "is_gathered", "rowwise", "rowwise_dequantized"]

_E8M0 = torch.float8_e8m0fnu


def is_gathered(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is FSDP's gathered MX cast. False while torch.compile traces,
    so that compiled code without the MX gathers never reads a DTensor's local tensor
    (they are eager-only: parallelize refuses compile with them).

    Args:
        weight: an MXLinear's weight, plain or a DTensor.

    Returns:
        True for (a DTensor of) an ``MXGatheredWeight``.
    """
    if torch.compiler.is_compiling():
        return False
    local = weight._local_tensor if isinstance(weight, DTensor) else weight
    return isinstance(local, MXGatheredWeight)


def _checked(weight: torch.Tensor, want: str, c: MXLinearConfig) -> MXGatheredWeight:
    g = weight._local_tensor if isinstance(weight, DTensor) else weight
    s = g._state
    if s.orientation != want:
        why = (
            "a forward inside backward (activation-checkpointing recompute) is not "
            "supported with fsdp_mx_all_gather"
            if want == "rowwise"
            else "FSDP did not gather it again for backward: fsdp_mx_all_gather needs "
            "fully_shard(..., reshard_after_forward=True) on the module holding it"
        )
        raise RuntimeError(
            f"{s.layer}: {'forward' if want == 'rowwise' else 'backward'} needs the "
            f"{want} MX cast of the weight, but its last FSDP all-gather moved the "
            f"{s.orientation} one; {why}"
        )
    if s.cast != (c.weight_fmt, c.block_size, c.scale_mode_name) or g.dtype != s.source_dtype:
        raise RuntimeError(
            f"{s.layer}: the weight was gathered as the cast {s.cast} of its "
            f"{s.source_dtype} values, but the layer needs "
            f"{(c.weight_fmt, c.block_size, c.scale_mode_name)} of {g.dtype} values"
        )
    return g


def _like(weight: torch.Tensor, local: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """``local`` (2-D, row- or column-major) as ``weight`` is: a DTensor on its mesh with
    its placements (swapped for a [K, N] tensor), or itself."""
    if not isinstance(weight, DTensor):
        return local
    mesh, placements = weight.device_mesh, []
    for p in weight.placements:
        if p.is_shard() and type(p) is not Shard:
            raise ValueError(f"fsdp_mx_all_gather: no rule for a weight placed {p}")
        dim = p.dim % 2 if p.is_shard() else None
        placements.append(p if dim is None else Shard(1 - dim if transposed else dim))
    shape = list(local.shape)
    for i, p in enumerate(placements):
        if p.is_shard():
            shape[p.dim] *= mesh.size(i)
    column_major = not local.is_contiguous()
    stride = (1, shape[0]) if column_major else (shape[1], 1)
    return DTensor.from_local(
        local, mesh, placements, run_check=False, shape=torch.Size(shape), stride=stride
    )


def rowwise(weight: torch.Tensor, c: MXLinearConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The gathered rowwise cast: codes [N, K] and scales [N, K / bs] (E8M0), as
    ``mx_kernels.quantize_rowwise(weight)`` (DTensors with the weight's placements for
    a DTensor weight).

    Args:
        weight: the MXLinear's weight as FSDP2 gathered it (plain or a DTensor).
        c: the layer's config.

    Returns:
        ``(codes, scales)``.

    Raises:
        RuntimeError: the weight's last gather is not this orientation's cast, or not
            the config's cast (naming the layer and why).
        ValueError: a DTensor weight with a placement other than Shard or Replicate.
    """
    s = _checked(weight, "rowwise", c)._state
    return _like(weight, s.codes.view(s.codes_dtype)), _like(weight, s.scales.view(_E8M0))


def _colwise_local(g: MXGatheredWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [world, K, N_r bytes] as each rank cast them, and the scales [N / bs, K]."""
    s = g._state
    k = g.shape[1]
    codes = s.codes.view(-1).view(s.world, k, -1).view(s.codes_dtype)
    return codes, s.scales.view(-1).view(-1, k).view(_E8M0)


def colwise(weight: torch.Tensor, c: MXLinearConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The gathered columnwise cast as ``mx_kernels.quantize_colwise(weight)`` gives it:
    codes [K, N] row-major (one copy from the gathered rank blocks) and scales
    [K, N / bs] column-major.

    Args:
        weight: the MXLinear's weight as FSDP2 gathered it (plain or a DTensor).
        c: the layer's config.

    Returns:
        ``(codes, scales)`` (DTensors with swapped placements for a DTensor weight).

    Raises:
        RuntimeError: the weight's last gather is not this orientation's cast, or not
            the config's cast (naming the layer and why).
        ValueError: a DTensor weight with a placement other than Shard or Replicate.
    """
    codes, scales = _colwise_local(_checked(weight, "colwise", c))
    q = codes.permute(1, 0, 2).reshape(codes.shape[1], -1)
    return _like(weight, q, transposed=True), _like(weight, scales.t(), transposed=True)


def rowwise_dequantized(weight: torch.Tensor, c: MXLinearConfig) -> torch.Tensor:
    """The gathered rowwise cast's values, as ``mx_kernels.fake_quantize_rowwise(weight)``.

    Args:
        weight: the MXLinear's weight as FSDP2 gathered it (plain or a DTensor).
        c: the layer's config.

    Returns:
        [N, K] in the weight's dtype (a DTensor placed as the weight for a DTensor).

    Raises:
        RuntimeError: the weight's last gather is not this orientation's cast, or not
            the config's cast (naming the layer and why).
        ValueError: a DTensor weight with a placement other than Shard or Replicate.
    """
    g = _checked(weight, "rowwise", c)
    s = g._state
    values = mx_kernels.dequantize_rowwise(
        s.codes.view(s.codes_dtype), s.scales.view(_E8M0), c.weight_fmt,
        block_size=c.block_size, out_dtype=g.dtype, backend=c.cast_backend,
    )  # fmt: skip
    return _like(weight, values)


def colwise_dequantized(weight: torch.Tensor, c: MXLinearConfig) -> torch.Tensor:
    """The gathered columnwise cast's values [N, K] in the weight's dtype, as
    ``mx_kernels.fake_quantize_colwise(weight)``: each rank's block decoded along its
    rows, then one transposing copy.

    Args:
        weight: the MXLinear's weight as FSDP2 gathered it (plain or a DTensor).
        c: the layer's config.

    Returns:
        [N, K] in the weight's dtype (a DTensor placed as the weight for a DTensor).

    Raises:
        RuntimeError: the weight's last gather is not this orientation's cast, or not
            the config's cast (naming the layer and why).
        ValueError: a DTensor weight with a placement other than Shard or Replicate.
    """
    g = _checked(weight, "colwise", c)
    codes, scales = _colwise_local(g)
    world, k = codes.shape[0], codes.shape[1]
    per_rank = scales.view(world, -1, k).transpose(1, 2)  # [world, K, N_r / bs]
    values = mx_kernels.dequantize_rowwise(
        codes, per_rank, c.weight_fmt, block_size=c.block_size, out_dtype=g.dtype,
        backend=c.cast_backend,
    )  # [world, K, N_r]  # fmt: skip
    return _like(weight, values.transpose(1, 2).reshape(-1, k))
