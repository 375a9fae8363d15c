"""``MXLinear``: an ``nn.Linear`` whose three GEMMs run in MX with dynamic casts.

Forward and backward (X [M, K] the input with leading dims folded into M, W [N, K],
dY [M, N]); the cast of a tensor needed in both orientations is one pass
(``mx_kernels.quantize_both``):

- forward: X both (rowwise only where backward computes no MX dW), W both;
  Y = scaled_mm(X, W) (blocks along K).
- backward: dY both; dX = scaled_mm(dY, W^T) (blocks along N, W's columnwise cast saved
  from forward); dW = scaled_mm(dY^T, X^T) (blocks along M; X's columnwise cast saved
  from forward in place of X) or dY^T X in high precision.

Layers that read the same input tensor (q/k/v, gate/up) share its casts within one
call of their parent module: each cast of the input is made once there
(:mod:`mx_nn.casts.scopes`; under torch.compile the compiler merges the identical
casts). After an MX all-gather of mx-dtensor's styles no layer makes the forward one:
the gather's cast is handed over (:mod:`mx_nn.casts.gathered`).

Rows are padded with zeros to a multiple of the block size where a cast runs along M
(zeros add nothing to dW). fp6 formats and block sizes other than 32 have no MX GEMM:
they dequantize and multiply in fp32 (logged once).

DTensor inputs and weights (as ``parallelize_module`` makes them with PyTorch's
``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel`` and ``PrepareModuleInput``)
run on their local shards: every op has a sharding rule (:mod:`mx_dtensor`) that keeps
the placements and communicates nothing, so the layer runs as one op from the DTensors
to a DTensor on the local tensors (:mod:`mx_nn.dtensor.local_shards`; the same results bit for
bit as dispatching each op through DTensor, without its per-op host cost). The output is
Shard(-1) when the weight is Shard(0) (colwise), Partial when the input and weight
are sharded along K (rowwise), sharded as the input along M when M is. Folding the
leading dims into M keeps a sharded sequence dim sharded (DTensor turns it into a
strided shard, pytorch/pytorch#166483; a torch without that refuses the reshape
rather than gathering); padding an unsharded M is local to each rank. The layer refuses, naming
itself, a shard that would split an MX block: in_features or out_features per rank, or
tokens per rank where M is sharded (and the colwise casts need blocks along M), not a
multiple of the block size; and a Partial input.

Where ``scaled_mm`` would multiply bf16 dequantized operands anyway (its
``dequant_bf16`` design, sm90's choice; ``mx_kernels.bf16_gemm_design``), the layer
fuses each cast with its dequantize (``mx_kernels.fake_quantize_*``) and runs the bf16
GEMMs on the results: the same values and accumulation, fewer passes over memory. Not
for fp16 inputs. That path casts X along K to values and along M to MX codes and
scales in forward, keeps the codes for backward in place of X (decoded there for dW),
and casts W along N in backward (``save_mx_activations``, the default; without it X is
cast both ways to values from one read and those are kept, with W's). Under
torch.compile the weight's and dY's casts, made once per call, are left to the compiler
to launch (``inline=True``); X's, shared by the layers that read X, stay ops that the
compiler merges.
``MXLinearConfig.compute_path`` forces either path ("mx" or "fake_quant", on any
device); "auto" decides as above (:mod:`mx_nn.casts.compute_path`, which logs the choice once
per device).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

import mx_dtensor  # noqa: F401  (registers the mx ops' DTensor sharding rules)
from mx_nn.casts.compute_path import fake_quant_path
from mx_nn.casts.scopes import add_cast_scope
from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.dtensor.local_shards import check_local_shard, local_shards_enabled, on_local_shards
from mx_nn.dtensor.placements import linear_layout
from mx_nn.linear_gemms import FakeQuantLinearFunction, MXLinearFunction, route_bf16_gemms

__all__ = ["MXLinear", "route_bf16_gemms", "share_input_casts"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the casts take


class MXLinear(nn.Linear):
    """``nn.Linear`` computing its three GEMMs in MX (see the module doc).

    Same parameters, state_dict keys and dtypes as ``nn.Linear``; ``in_features`` and
    ``out_features`` must be multiples of ``config.block_size``. ``config``: an
    :class:`MXLinearConfig` or a recipe name (default: the ``mxfp8`` recipe's config).
    Input [..., K] of any rank >= 1 in fp32/bf16/fp16 (under autocast, the autocast
    dtype); output [..., N].
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        config: MXLinearConfig | str | MXRecipe | None = None,
        fqn: str | None = None,
    ) -> None:
        config = _as_config(config)
        _check_dims(in_features, out_features, config)
        super().__init__(in_features, out_features, bias, device, dtype)
        self.config = config
        self.fqn = fqn

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        config: MXLinearConfig | str | MXRecipe | None = None,
        *,
        fqn: str | None = None,
    ) -> MXLinear:
        """An MXLinear sharing ``linear``'s Parameter objects (no copy). ``fqn``: the
        layer's name in its model, which errors quote (``convert`` passes it)."""
        config = _as_config(config)
        _check_dims(linear.in_features, linear.out_features, config)
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        new.config = config
        new.fqn = fqn
        new.train(linear.training)
        return new

    @property
    def layer_name(self) -> str:
        """How errors name this layer: its fqn and features."""
        name = f" {self.fqn!r}" if self.fqn else ""
        return f"MXLinear{name} (in_features={self.in_features}, out_features={self.out_features})"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x, weight, device = input, self.weight, input.device
        # in_features, or this rank's part of it where a framework hands each linear
        # plain local shards (torchtitan 0.3's spmd_types backend; test_torchtitan_tp.py)
        k = weight.shape[-1]
        if x.dim() == 0 or x.shape[-1] != k:
            shard = "" if k == self.in_features else f" (this rank's shard: [..., {k}])"
            raise ValueError(
                f"{self.layer_name}: input of shape {tuple(x.shape)} must be [..., "
                f"in_features={self.in_features}]{shard}"
            )
        if k != self.in_features or weight.shape[0] != self.out_features:
            check_local_shard(self.layer_name, self.config.block_size, weight)
        # Under autocast both operands are cast as F.linear would cast them, and the MX
        # GEMMs run outside it. (Asked of any device first: one call, where asking of
        # this device costs a few.)
        dtype = None
        if torch._C._is_any_autocast_enabled() and torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        if not x.is_floating_point() or (
            dtype is None and (x.dtype not in _DTYPES or weight.dtype not in _DTYPES)
        ):
            raise TypeError(
                f"{self.layer_name}: input dtype {x.dtype} and weight dtype {weight.dtype}; "
                f"allowed for each: {', '.join(map(str, _DTYPES))} (or run under autocast)"
            )
        fn = self._function(device, dtype or x.dtype, dtype or weight.dtype)
        # Whether backward will compute dW: forward then prepares X's cast along M
        # (autograd.Function.forward sees requires_grad even under no_grad).
        weight_grad = weight.requires_grad and torch.is_grad_enabled()
        if isinstance(x, DTensor) or isinstance(weight, DTensor):
            layout = linear_layout(self.layer_name, x, weight, self.config)
            if local_shards_enabled():
                y = on_local_shards(fn, x, weight, self.config, layout, dtype, weight_grad)
                return y if self.bias is None else y + self.bias.to(y.dtype)
        if dtype is not None:
            x, weight = x.to(dtype), weight.to(dtype)
            with torch.autocast(device.type, enabled=False):
                y = fn.apply(x, weight, self.config, weight_grad)
        else:
            y = fn.apply(x, weight, self.config, weight_grad)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _function(self, device: torch.device, x_dtype: torch.dtype, w_dtype: torch.dtype):
        """The autograd function that computes the layer: the fused or the MX path."""
        c = self.config
        if c.compute_path == "fake_quant" and torch.float16 in (x_dtype, w_dtype):
            raise ValueError(
                f"{self.layer_name}: compute_path='fake_quant' takes no fp16 input or weight "
                "(fake-quantized values can leave fp16's range); use bf16/fp32 or 'mx'"
            )
        fused = fake_quant_path(device, c, x_dtype)
        return FakeQuantLinearFunction if fused else MXLinearFunction

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, config={self.config}"


def _as_config(config) -> MXLinearConfig:
    if config is None:
        return MXLinearConfig()
    if isinstance(config, MXLinearConfig):
        return config
    if isinstance(config, (str, MXRecipe)):
        return MXLinearConfig.from_recipe(config)
    raise TypeError(
        f"MXLinear: config must be an MXLinearConfig or a recipe name, got "
        f"{type(config).__name__} {config!r}"
    )


def _check_dims(in_features: int, out_features: int, config: MXLinearConfig) -> None:
    bs = config.block_size
    if in_features % bs or out_features % bs:
        raise ValueError(
            f"MXLinear needs in_features and out_features divisible by block_size={bs}, "
            f"got in_features={in_features}, out_features={out_features}"
        )


def share_input_casts(model: nn.Module) -> int:
    """Give every module of ``model`` (itself included) with two or more MXLinear
    children a cast scope (:func:`mx_nn.casts.scopes.add_cast_scope`): within each of its
    calls, the children that read one input tensor share its casts (q/k/v, gate/up).
    ``convert`` calls it; call it after building a model with MXLinear layers by hand.
    Idempotent.

    Args:
        model: any module.

    Returns:
        How many modules have a scope now.
    """
    n = 0
    for module in model.modules():
        if sum(isinstance(c, MXLinear) for c in module.children()) >= 2:
            add_cast_scope(module)
            n += 1
    return n
