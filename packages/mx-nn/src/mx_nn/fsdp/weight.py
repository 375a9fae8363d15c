"""FSDP2 all-gathers of :class:`mx_nn.MXLinear` weights in MX instead of high precision.

:func:`~mx_nn.fsdp.enable.enable_fsdp_mx_all_gather` (``parallelize(...,
fsdp_mx_all_gather=True)`` calls it) makes each MXLinear weight's local tensor an
:class:`MXShardedWeight` before ``fully_shard``. FSDP2 then calls its all-gather extension points
(``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``, torch/distributed/fsdp/_fully_shard/
_fsdp_param.py) instead of gathering the weight itself:

- forward: each rank casts its shard W_r [N_r, K] rowwise (blocks along K) and gathers
  the codes [N_r, K] and E8M0 scales [N_r, K / bs]; together they are the rowwise cast
  of W [N, K] (a block never crosses a shard).
- backward (FSDP gathers again with ``reshard_after_forward=True``; a gather inside
  autograd's backward is told apart by ``torch._C._current_graph_task_id() != -1``):
  each rank casts its shard columnwise (blocks along N) and gathers the codes as the
  cast wrote them, [K, N_r], and the scales [N_r / bs, K]. The scales, [N / bs, K]
  after the gather, are the columnwise scales of W, exactly, when N_r is a multiple of
  bs; the codes are rearranged to [K, N] once after the gather.

Both passes gather two uint8 tensors (gloo refuses float8) of the same sizes (N_r * K
code bytes, N_r * K / bs scale bytes), so FSDP's reused all-gather buffers fit both:
1 + 1/bs bytes per element (fp8; fp4: 1/2 + 1/bs) against 2 for bf16 or 4 for fp32.

The unsharded parameter FSDP builds from them is an :class:`MXGatheredWeight`: the
weight's shape and dtype, holding only the gathered bytes and which cast they are. An
MXLinear reads it (:mod:`mx_nn.fsdp.gathered`) instead of casting the weight; its
forward keeps only the parameter for backward, whose storage FSDP frees after the block
and refills in backward. Every other op on it raises. Reading the wrong cast (a
forward inside backward, as activation-checkpointing recompute does; a backward
without the re-gather, as ``reshard_after_forward=False`` gives) raises.

With tensor parallelism the weight is a DTensor on "tp" whose local tensor is the
MXShardedWeight: FSDP2 shards (and gathers) that local tensor along its dim 0, and its
unsharded parameter is a DTensor on "tp" whose local tensor is the MXGatheredWeight.

Under autocast the forward gather casts the weight in the autocast dtype, as MXLinear
would, and the backward gather of the same weight reuses that dtype. Eager only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_map

import mx_kernels
from mx_nn.config import MXLinearConfig

__all__ = ["MXGatheredWeight", "MXShardedWeight", "ShardState", "is_sharded", "row_chunks"]

aten = torch.ops.aten
# Ops that FSDP2 uses to build, pad, view and move the sharded parameter: their results
# stay MXShardedWeight. Everything else (optimizer state from zeros_like, clone, math)
# returns plain tensors; in-place ops return the MXShardedWeight they changed.
_SHARDED_KEEP = {
    aten.alias, aten.as_strided, aten.detach, aten.new_empty, aten.new_zeros, aten.slice,
    aten.split, aten.split_with_sizes, aten.view, aten._unsafe_view, aten._to_copy,
}  # fmt: skip


@dataclass
class ShardState:
    """What an :class:`MXShardedWeight` and its views share: the layer's name (for
    errors) and the dtype its last forward gather cast from."""

    layer: str
    forward_dtype: torch.dtype | None = None  # the dtype the last forward gather cast from


@dataclass
class _GatherState:
    """What the last all-gather of one weight moved; shared by every alias of its
    unsharded parameter (FSDP refills it in place, autograd saves an alias)."""

    layer: str
    orientation: str = ""  # "rowwise" (forward) or "colwise" (backward)
    codes: torch.Tensor | None = None  # uint8 [world * N_r, code bytes per row]
    scales: torch.Tensor | None = None  # uint8 [world * N_r, K / bs]
    world: int = 0
    rows: int = 0  # N_r, rows per rank
    codes_dtype: torch.dtype | None = None
    source_dtype: torch.dtype | None = None  # the dtype the weight was cast from
    cast: tuple = ()  # (fmt, block_size, scale_mode) of the cast

    def update(self, codes: torch.Tensor, scales: torch.Tensor, metadata: tuple) -> None:
        self.codes, self.scales = codes, scales
        (self.orientation, self.world, self.rows, self.codes_dtype, self.source_dtype,
         self.cast, _shape) = metadata  # fmt: skip


def _wrapper(cls, shape, dtype, device, strides=None, offset=None) -> torch.Tensor:
    return torch.Tensor._make_wrapper_subclass(
        cls, shape, strides=strides, storage_offset=offset, dtype=dtype, device=device,
        requires_grad=False,
    )  # fmt: skip


def row_chunks(rows: int, world: int) -> list[int]:
    """How torch.chunk (and FSDP2) split a dim over ranks.

    Args:
        rows: the dim's size.
        world: the number of ranks.

    Returns:
        Rows per rank, ``world`` ints (the last ones may be 0).
    """
    chunk = -(-rows // world)
    return [max(0, min(chunk, rows - r * chunk)) for r in range(world)]


class MXShardedWeight(torch.Tensor):
    """An MXLinear weight's FSDP shard (FSDP's sharded local tensor), in high precision,
    whose all-gathers move MX casts (see the module doc). Ops run on the plain tensor
    it wraps; FSDP's views and copies of it stay this type."""

    _data: torch.Tensor
    _state: ShardState

    @staticmethod
    def __new__(cls, data: torch.Tensor, state: ShardState):
        return _wrapper(
            cls, data.shape, data.dtype, data.device, data.stride(), data.storage_offset()
        )

    def __init__(self, data: torch.Tensor, state: ShardState) -> None:
        self._data, self._state = data, state

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:
        return f"MXShardedWeight({self._state.layer}, {self._data!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        wrapped: dict[int, MXShardedWeight] = {}

        def unwrap(t):
            if isinstance(t, MXShardedWeight):
                wrapped[id(t._data)] = t
                return t._data
            return t

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        state = next(iter(wrapped.values()))._state

        def wrap(t):
            if not isinstance(t, torch.Tensor):
                return t
            same = wrapped.get(id(t))
            if same is not None and same._data is t:  # an in-place op returns its input
                return same
            return MXShardedWeight(t, state) if func.overloadpacket in _SHARDED_KEEP else t

        return tree_map(wrap, out)

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """FSDP2's hook: this rank's all-gather inputs, the rowwise cast in forward and
        the columnwise one in backward, as two uint8 tensors [N_r, code bytes] and
        [N_r, K / bs]; and the metadata :meth:`fsdp_post_all_gather` reads."""
        c: MXLinearConfig = module.config
        w, state = self._data, self._state
        backward = torch._C._current_graph_task_id() != -1
        dtype = mp_policy.param_dtype or w.dtype
        if backward:
            source = state.forward_dtype or dtype
        else:
            device = w.device.type
            enabled = torch.is_autocast_enabled(device)
            source = torch.get_autocast_dtype(device) if enabled else dtype
            state.forward_dtype = source
        rows, bs, world = w.shape[0], c.block_size, mesh.size()
        if outer_size[0] % world or (outer_size[0] // world) % bs:
            # Every rank raises (the sizes are global), so none waits in the collective.
            raise ValueError(
                f"{state.layer}: FSDP splits the weight {tuple(outer_size)} over {world} "
                f"ranks into rows {row_chunks(outer_size[0], world)}, not all multiples of the "
                f"MX block size {bs}: the columnwise cast's blocks would cross shards"
            )
        w = w.to(dtype).to(source)
        kw = {"block_size": bs, "scale_mode": c.scale_mode_name, "backend": c.cast_backend}
        if backward:
            q, s = mx_kernels.quantize_colwise(w, c.weight_fmt, **kw)
            s = s.t()  # the cast's contiguous [N_r / bs, K] buffer
        else:
            q, s = mx_kernels.quantize_rowwise(w, c.weight_fmt, **kw)
        inputs = (q.view(torch.uint8).reshape(rows, -1), s.view(torch.uint8).reshape(rows, -1))
        cast = (c.weight_fmt, bs, c.scale_mode_name)
        orientation = "colwise" if backward else "rowwise"
        meta = (orientation, world, rows, q.dtype, source, cast, tuple(outer_size))
        return inputs, meta

    def fsdp_post_all_gather(
        self,
        all_gather_outputs: tuple[torch.Tensor, ...],
        metadata: Any,
        param_dtype: torch.dtype,
        *,
        out: torch.Tensor | None = None,
    ):
        """FSDP2's hook: the unsharded parameter (an :class:`MXGatheredWeight` of the
        weight's shape) and its gathered buffers; with ``out``, refill that one."""
        codes, scales = all_gather_outputs
        if out is not None:
            local = out._local_tensor if isinstance(out, DTensor) else out
            if not isinstance(local, MXGatheredWeight):
                raise TypeError(f"{self._state.layer}: FSDP passed out={type(local).__name__}")
            local._state.update(codes, scales, metadata)
            return None
        state = _GatherState(self._state.layer)
        state.update(codes, scales, metadata)
        shape = metadata[-1]
        return MXGatheredWeight(shape, param_dtype, codes.device, state), (codes, scales)


class MXGatheredWeight(torch.Tensor):
    """FSDP's unsharded MXLinear weight [N, K] when it gathered MX: the shape and dtype of
    the weight, the gathered codes and scales of one cast (rowwise after a forward
    gather, columnwise after a backward one). Only MXLinear reads it
    (:mod:`mx_nn.fsdp.gathered`); FSDP's views and ``zeros_like`` work, ``.to(dtype)``
    works to the dtype the cast was made from (autocast), any other op raises."""

    _state: _GatherState

    @staticmethod
    def __new__(cls, shape, dtype: torch.dtype, device: torch.device, state: _GatherState):
        return _wrapper(cls, shape, dtype, device)

    def __init__(self, shape, dtype, device, state: _GatherState) -> None:
        self._state = state

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:
        s = self._state
        return f"MXGatheredWeight({s.layer}, {s.orientation} cast, shape={tuple(self.shape)})"

    def _alias(self, dtype: torch.dtype | None = None) -> MXGatheredWeight:
        return MXGatheredWeight(self.shape, dtype or self.dtype, self.device, self._state)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        w = next(t for t in tree_flatten((args, kwargs))[0] if isinstance(t, MXGatheredWeight))
        first = args[0] is w
        if first and func in (aten.detach.default, aten.alias.default):
            return w._alias()
        if first and func in (aten.view.default, aten.as_strided.default):
            if _same_layout(w, args):
                return w._alias()
        elif first and func is aten._to_copy.default and _to_copy_ok(w, kwargs):
            return w._alias(kwargs.get("dtype"))
        elif first and func.overloadpacket in _FACTORIES:
            like = func.overloadpacket in (aten.zeros_like, aten.empty_like)
            make = torch.zeros if func.overloadpacket in _ZEROS else torch.empty
            size = w.shape if like else args[1]
            dtype, device = kwargs.get("dtype") or w.dtype, kwargs.get("device") or w.device
            return make(size, dtype=dtype, device=device)
        raise RuntimeError(
            f"{w._state.layer}: its weight is FSDP's gathered MX cast (fsdp_mx_all_gather="
            f"True), which only MXLinear reads; {func} is not defined on it"
        )


_ZEROS = (aten.zeros_like, aten.new_zeros)
_FACTORIES = (*_ZEROS, aten.empty_like, aten.new_empty)


def _same_layout(w: MXGatheredWeight, args) -> bool:
    size = tuple(args[1])
    contiguous = torch._prims_common.make_contiguous_strides_for(w.shape)
    if size != tuple(w.shape):
        return False
    return len(args) < 3 or (tuple(args[2]) == tuple(contiguous) and not (args[3:] and args[3]))


def _to_copy_ok(w: MXGatheredWeight, kwargs: dict) -> bool:
    dtype = kwargs.get("dtype") or w.dtype
    device = kwargs.get("device") or w.device
    if torch.device(device) != w.device or dtype not in (w.dtype, w._state.source_dtype):
        raise RuntimeError(
            f"{w._state.layer}: its gathered weight holds the MX cast of the weight in "
            f"{w._state.source_dtype} on {w.device}; it cannot become {dtype} on {device}"
        )
    return True


def is_sharded(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is FSDP's MX-gathering shard.

    Args:
        weight: an MXLinear's weight, plain or a DTensor.

    Returns:
        True for (a DTensor of) an :class:`MXShardedWeight`.
    """
    local = weight._local_tensor if isinstance(weight, DTensor) else weight
    return isinstance(local, MXShardedWeight)
