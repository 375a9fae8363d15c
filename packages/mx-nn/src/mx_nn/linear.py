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
for fp16 inputs or when the MX casts are saved (``save_mx_activations``). That path casts
X both ways in forward (one read) and saves the columnwise values instead of X. Under
torch.compile the weight's and dY's casts, made once per call, are left to the compiler
to launch (``inline=True``); X's, shared by the layers that read X, stay ops that the
compiler merges.
``MXLinearConfig.compute_path`` forces either path ("mx" or "fake_quant", on any
device); "auto" decides as above (:mod:`mx_nn.casts.compute_path`, which logs the choice once
per device).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

import mx_dtensor  # noqa: F401  (registers the mx ops' DTensor sharding rules)
import mx_kernels
import mx_nn.fsdp.gathered as fsdp_gathered
from mx_core import MXTensor, get_format
from mx_kernels.matmul import bf16_gemm
from mx_nn.casts.compute_path import GEMM_BLOCK, fake_quant_path
from mx_nn.casts.fused import fused_casts
from mx_nn.casts.layer import (
    as_rows,
    cast_weight,
    config_cast,
    fake_quantized_input,
    mx_input,
    pad_rows,
)
from mx_nn.casts.scopes import add_cast_scope
from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.dtensor.local_shards import (
    check_local_shard,
    local_shards_enabled,
    on_local_shards,
    reduced,
)
from mx_nn.dtensor.placements import linear_layout

__all__ = ["MXLinear", "route_bf16_gemms", "share_input_casts"]

logger = logging.getLogger("mx_nn")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the casts take
_LOGGED: set[tuple[str, str]] = set()  # (why, device) of the emulated GEMMs logged
_bf16_gemm = bf16_gemm  # the fused path's GEMM: route_bf16_gemms() replaces it


def _gemm(a, a_fmt: str, b, b_fmt: str, out_dtype: torch.dtype, c: MXLinearConfig):
    """``a @ b^T`` of two rowwise casts ``(qdata, scale)``, K-major both."""
    fp6 = [f for f in (a_fmt, b_fmt) if get_format(f).bits == 6]
    if not fp6 and c.block_size == GEMM_BLOCK:
        return mx_kernels.scaled_mm(*a, *b, out_dtype=out_dtype, backend=c.gemm_backend)
    why = f"{fp6[0]} has no MX GEMM" if fp6 else f"block_size={c.block_size} != 32"
    if (why, str(a[0].device)) not in _LOGGED:
        _LOGGED.add((why, str(a[0].device)))
        logger.info("mx_nn.MXLinear: fp32 emulated GEMM on %s (%s)", a[0].device.type, why)
    a_hp = MXTensor(a[0], a[1], a_fmt, c.block_size, 1, torch.float32).dequantize()
    b_hp = MXTensor(b[0], b[1], b_fmt, c.block_size, 1, torch.float32).dequantize()
    return (a_hp @ b_hp.t()).to(out_dtype)


class _MXLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, c: MXLinearConfig, weight_grad: bool
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        (x_q, x_s), saved_x = mx_input(x2, c, c.needs_colwise_input and weight_grad)
        ctx.gathered_weight = fsdp_gathered.is_gathered(weight)  # FSDP gathered it in MX
        if ctx.gathered_weight:  # its rowwise cast; backward's gather brings the colwise one
            (w_q, w_s), saved_w = fsdp_gathered.rowwise(weight, c), (weight,)
        else:
            w_q, w_s, *saved_w = cast_weight(mx_kernels.quantize_both, weight, c.weight_fmt, c)
        y = _gemm((x_q, x_s), c.input_fmt, (w_q, w_s), c.weight_fmt, x.dtype, c)
        ctx.save_for_backward(*saved_w, *saved_x)
        # No shapes on ctx (SymInts there trip torch 2.11's dynamo, as in check_scaled_mm_args).
        ctx.config, ctx.x_dtype, ctx.w_dtype = c, x.dtype, weight.dtype
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        c: MXLinearConfig = ctx.config
        saved = ctx.saved_tensors
        if ctx.gathered_weight:
            saved = (*fsdp_gathered.colwise(saved[0], c), *saved[1:])
        wt_q, wt_s, *saved_x = saved
        dy = reduced(grad_output).reshape(-1, grad_output.shape[-1])
        m = dy.shape[0]
        grad_x = grad_w = None
        if c.hp_weight_grad:
            if ctx.needs_input_grad[1]:
                (x2,) = saved_x
                grad_w = (dy.t() @ x2.to(dy.dtype)).to(ctx.w_dtype)
            dy_q, dy_s = config_cast(mx_kernels.quantize_rowwise, dy, c.grad_output_fmt, c)
        else:
            dy_q, dy_s, dyt_q, dyt_s = config_cast(
                mx_kernels.quantize_both, pad_rows(dy, c.block_size), c.grad_output_fmt, c
            )
            dy_q, dy_s = dy_q[:m], dy_s[:m]
            if ctx.needs_input_grad[1]:
                xt_q, xt_s = saved_x  # X's columnwise cast, made in forward
                grad_w = _gemm(
                    (dyt_q, dyt_s), c.grad_output_fmt, (xt_q, xt_s), c.input_fmt, ctx.w_dtype, c
                )
        if ctx.needs_input_grad[0]:
            grad_x = _gemm(
                (dy_q, dy_s), c.grad_output_fmt, (wt_q, wt_s), c.weight_fmt, ctx.x_dtype, c
            ).reshape(*grad_output.shape[:-1], wt_q.shape[0])
        return grad_x, grad_w, None, None


class _FakeQuantLinearFunction(torch.autograd.Function):
    """The same three GEMMs where ``scaled_mm`` would dequantize to bf16 anyway (sm90):
    each cast writes the dequantized values (``mx_kernels.fake_quantize_*``, one pass),
    then bf16 GEMMs take them in either orientation. Same values and accumulation as
    the MX path through ``scaled_mm``; no transposed copies, no code bytes."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, c: MXLinearConfig, weight_grad: bool
    ) -> torch.Tensor:
        x2 = as_rows(x)
        colwise = c.needs_colwise_input and weight_grad
        ctx.casts = casts = fused_casts(x2, weight, c, colwise)
        ctx.gathered_weight = False
        if casts is not None:  # the plain case: its casts' plans, directly
            xf, xf_col = casts.input(x2)
            wf_row, wf_col = casts.weight(weight)
        else:
            xf, xf_col = fake_quantized_input(x2, c, colwise)
            ctx.gathered_weight = fsdp_gathered.is_gathered(weight)  # FSDP gathered it in MX
            if ctx.gathered_weight:  # saved: backward's gather brings the colwise cast
                wf_row, wf_col = fsdp_gathered.rowwise_dequantized(weight, c), weight
            else:
                fn = mx_kernels.fake_quantize_both  # inline: W is cast once
                wf_row, wf_col = cast_weight(fn, weight, c.weight_fmt, c, inline=True)
        y = _bf16_gemm(xf, wf_row.t(), x.dtype)
        # Saved: X cast along M where backward computes the MX dW, else X itself.
        ctx.save_for_backward(wf_col, x2 if xf_col is None else xf_col)
        ctx.config, ctx.x_dtype, ctx.w_dtype = c, x.dtype, weight.dtype
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        c: MXLinearConfig = ctx.config
        wf_col, saved_x = ctx.saved_tensors
        if ctx.gathered_weight:
            wf_col = fsdp_gathered.colwise_dequantized(wf_col, c)
        dy = as_rows(reduced(grad_output))
        grad_x = grad_w = None
        if c.hp_weight_grad:
            if ctx.needs_input_grad[1]:
                grad_w = (dy.t() @ saved_x.to(dy.dtype)).to(ctx.w_dtype)
            fn = mx_kernels.fake_quantize_rowwise  # inline: dY is cast once
            dyf = config_cast(fn, dy, c.grad_output_fmt, c, inline=True)
        else:
            casts = ctx.casts and ctx.casts.grad_output(dy)
            if casts is not None:
                dyf, dyf_col = casts
            else:
                dy_pad = pad_rows(dy, c.block_size)  # colwise blocks run along M
                fn = mx_kernels.fake_quantize_both  # inline: dY is cast once
                dyf, dyf_col = config_cast(fn, dy_pad, c.grad_output_fmt, c, inline=True)
                if dy_pad is not dy:
                    dyf = dyf[: dy.shape[0]]
            if ctx.needs_input_grad[1]:  # saved_x: X cast along M in forward
                grad_w = _bf16_gemm(dyf_col.t(), saved_x, ctx.w_dtype)
        if ctx.needs_input_grad[0]:
            grad_x = _bf16_gemm(dyf, wf_col, ctx.x_dtype)
            if grad_output.dim() != 2:
                grad_x = grad_x.reshape(*grad_output.shape[:-1], wf_col.shape[1])
        return grad_x, grad_w, None, None


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
        return _FakeQuantLinearFunction if fused else _MXLinearFunction

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


@contextlib.contextmanager
def route_bf16_gemms(
    gemm: Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor],
) -> Iterator[None]:
    """Inside, MXLinear's fused path (fake-quantized casts + bf16 GEMMs) runs its three
    GEMMs through ``gemm`` instead of ``mx_kernels.bf16_gemm``: for benchmarking the host
    cost of a step, e.g. with the GEMMs CUDA would run, on CPU
    (``tools/bench/host_cost.py --step``). The MX path (``scaled_mm``) is unaffected.

    Process-wide (every layer, every thread); nests, and restores the GEMM it found on
    exit, also on an exception.

    Args:
        gemm: called as ``mx_kernels.bf16_gemm`` is: ``gemm(a, b, out_dtype)`` with a
            [M, K] and b [K, N] of any strides and dtypes (the fake-quantized operands),
            returning ``a @ b`` [M, N] in ``out_dtype``.

    Raises:
        TypeError: ``gemm`` is not callable.
    """
    global _bf16_gemm
    if not callable(gemm):
        raise TypeError(f"route_bf16_gemms: gemm must be callable, got {type(gemm).__name__}")
    before, _bf16_gemm = _bf16_gemm, gemm
    try:
        yield
    finally:
        _bf16_gemm = before
