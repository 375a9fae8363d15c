"""The fused path's three casts of one layer call (X, W and dY, each
``fake_quantize_both``), resolved once per call signature and run through their cast
plans directly.

At the per-rank shapes of tensor parallelism the host issues an MXLinear step slower
than the GPU runs it, and every Python call on that path counts, several times over
inside a step (BENCHMARKS.md, 2026-12-05 'TP layer: where the step goes'). The public
cast functions find their plan on each call (argument checks, dispatch conditions, a
key of the tensor's layout); here a layer call finds its three plans with one lookup of
X's and W's layouts and the config, and dY's on the first backward of that signature.
The plans are the ones the ``mx::`` ops run (:func:`mx_kernels.cast_plan.plan_for`):
the same kernels and outputs bit for bit.

Only where calling a plan is indistinguishable from calling the op
(:func:`mx_kernels.library.may_skip_dispatch`: eager, plain tensors, no dispatch or
function mode, no profiler) and the layer call is the plain case: the config casts X
along M (no ``hp_weight_grad``), no weight casts kept across calls
(``mx_nn.keep_weight_casts``), rows need no padding, no MX gather handed X's cast over.
Everything else takes the general path, through the public functions.
"""

from __future__ import annotations

import torch

import mx_kernels
from mx_core import get_format
from mx_kernels.cast_plan import CastPlan, plan_for
from mx_kernels.library import may_skip_dispatch
from mx_nn.casts.compute_path import cast_kwargs
from mx_nn.casts.scopes import cast_shared_plan, peek_cast, weight_casts_kept
from mx_nn.config import MXLinearConfig

__all__ = ["FusedCasts", "fused_casts"]

_OP = "fake_quantize_both"
_ROW = "fake_quantize_rowwise"
_X_MX = "fake_quantize_rowwise_quantize_colwise"  # X's casts where backward keeps MX codes
_SITE = "fused casts: X"  # X's casts, shared by the layers reading X
_SITE_MX = "fused casts: X rowwise, colwise MX"
_PLAIN = (torch.Tensor, torch.nn.Parameter)
MAX_SIGNATURES = 4096  # kept before starting afresh


class FusedCasts:
    """One call signature's plans: X [M, K] and W [N, K] each cast along both dims;
    dY [M, N] planned on its first backward (its layout is known only then). With
    ``save_mx_activations`` X's columnwise cast is MX codes and scales and W's is made
    in backward (:func:`mx_nn.casts.layer.fake_quantized_input`)."""

    __slots__ = ("config", "args", "x_plans", "w_plans", "dy_key", "dy_plan")

    def __init__(self, c: MXLinearConfig, x2: torch.Tensor, weight: torch.Tensor) -> None:
        self.config = c  # kept: the cache is keyed by its id
        bs, mode, backend = c.block_size, c.scale_mode_name, c.cast_backend
        self.args = (get_format(c.grad_output_fmt).name, bs, mode, backend)
        x_fmt, w_fmt = get_format(c.input_fmt).name, get_format(c.weight_fmt).name
        if c.save_mx_activations:
            # one plan, public layout: (row values, qdata_t, scale_t) as quantize_colwise
            self.x_plans = (plan_for(_X_MX, True, x2, x_fmt, bs, mode, backend),)
            self.w_plans = (
                plan_for(_ROW, False, weight, w_fmt, bs, mode, backend),
                plan_for("fake_quantize_colwise", False, weight, w_fmt, bs, mode, backend),
            )
        else:
            self.x_plans = (plan_for(_OP, False, x2, x_fmt, bs, mode, backend),)
            self.w_plans = (plan_for(_OP, False, weight, w_fmt, bs, mode, backend),)
        self.dy_key: tuple | None = None
        self.dy_plan: CastPlan | None = None

    def input(self, x2: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """X's rowwise fake-quantized values and its columnwise cast as backward keeps it
        (``fake_quantized_input``'s results), made once for the layers that read the
        same X within one call of their parent (:mod:`mx_nn.casts.scopes`)."""
        if not self.config.save_mx_activations:
            row, col = cast_shared_plan(_SITE, self.x_plans[0], x2)
            return row, (col,)
        row, q_t, s_t = cast_shared_plan(_SITE_MX, self.x_plans[0], x2)
        return row, (q_t, s_t)

    def weight(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """W's rowwise fake-quantized values, and its columnwise ones where made now
        (None: :meth:`weight_colwise` makes them in backward)."""
        if len(self.w_plans) == 1:
            return self.w_plans[0](weight)
        return self.w_plans[0](weight), None

    def weight_colwise(self, weight: torch.Tensor) -> torch.Tensor:
        """W's columnwise fake-quantized values, made in backward."""
        return self.w_plans[-1](weight)

    def grad_output(self, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """dY's (rowwise, columnwise) fake-quantized values, or None where the plan does
        not apply to this dY (a subclass, a mode, a dY that requires grad)."""
        if not may_skip_dispatch(dy):
            return None
        key = (dy.shape, dy.stride(), dy.dtype, dy.device)
        if key != self.dy_key:
            if dy.dim() != 2 or dy.shape[0] % self.config.block_size:
                return None
            self.dy_plan, self.dy_key = plan_for(_OP, False, dy, *self.args), key
        return self.dy_plan(dy)


_CASTS: dict[tuple, FusedCasts] = {}


def fused_casts(
    x2: torch.Tensor, weight: torch.Tensor, c: MXLinearConfig, colwise: bool
) -> FusedCasts | None:
    """The plans of a fused-path call on X [M, K] and ``weight`` (see the module doc).

    Args:
        x2: X [M, K].
        weight: W [N, K].
        c: the layer's config.
        colwise: whether backward computes the MX dW.

    Returns:
        The call's :class:`FusedCasts` (made once per signature), or None where the
        general path runs.
    """
    if not (colwise and may_skip_dispatch(x2) and type(weight) in _PLAIN):
        return None
    if weight_casts_kept() or x2.shape[0] % c.block_size or _handed(x2, c):
        return None
    key = (id(c), x2.shape, x2.stride(), x2.dtype, x2.device, weight.shape, weight.stride(),
           weight.dtype, weight.device)  # fmt: skip
    casts = _CASTS.get(key)
    if casts is None or casts.config is not c:
        if len(_CASTS) >= MAX_SIGNATURES:
            _CASTS.clear()
        casts = _CASTS[key] = FusedCasts(c, x2, weight)
    return casts


def _handed(x2: torch.Tensor, c: MXLinearConfig) -> bool:
    """Whether an MX gather handed X's rowwise cast over (:mod:`mx_nn.casts.gathered`):
    the general path takes it instead of casting."""
    rowwise = mx_kernels.fake_quantize_rowwise
    return peek_cast(rowwise.__name__, rowwise, x2, c.input_fmt, **cast_kwargs(c)) is not None
