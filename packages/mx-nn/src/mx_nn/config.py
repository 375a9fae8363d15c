"""``MXLinearConfig`` and the named recipes.

The three GEMMs of a linear layer and which config fields feed them (X [M, K] input,
W [N, K] weight, dY [M, N] grad_output):

=================  =========================================  ==================
GEMM               left operand (blocks along)                right operand
=================  =========================================  ==================
Y  = X W^T         X, ``input_fmt`` (K)                       W, ``weight_fmt`` (K)
dX = dY W          dY, ``grad_output_fmt`` (N)                W, ``weight_fmt`` (N)
dW = dY^T X        dY, ``grad_output_fmt`` (M)                X, ``input_fmt`` (M)
=================  =========================================  ==================

``hp_weight_grad`` runs the dW GEMM in high precision instead. All casts use
``block_size`` and ``scale_mode``.

``compute_path`` picks how the three GEMMs run: ``"mx"``, MX casts (codes and scales)
then ``mx_kernels.scaled_mm``; ``"fake_quant"``, casts fused with their dequantize
(``mx_kernels.fake_quantize_*``) then bf16 GEMMs on the MX values, the same values and
fp32 accumulation as ``scaled_mm``'s ``dequant_bf16`` design; ``"auto"``, the fused path
exactly where ``scaled_mm`` would run that design (sm90), else ``"mx"``.
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass

import torch

from mx_core import get_format, get_scale_mode
from mx_kernels.backend import BACKENDS, MATMUL_BACKENDS

__all__ = ["COMPUTE_PATHS", "MXLinearConfig", "MXRecipe"]

COMPUTE_PATHS: tuple[str, ...] = ("auto", "mx", "fake_quant")
_MODE_NAMES: dict = {}  # scale_mode as given (validated) -> canonical name
"""Values of :attr:`MXLinearConfig.compute_path` (see the module doc)."""


class MXRecipe(str, enum.Enum):
    """Named presets of :class:`MXLinearConfig` (``MXLinearConfig.from_recipe``)."""

    # Y, dX, dW all e4m3 with RCEIL scales (what cuBLAS and Transformer Engine use).
    MXFP8 = "mxfp8"
    # As mxfp8 with the OCP spec's FLOOR scales.
    MXFP8_FLOOR = "mxfp8_floor"
    # Y in e4m3; dX and dW take grad_output in e5m2 (more range for gradients).
    MXFP8_E5M2_GRADS = "mxfp8_e5m2_grads"
    # Y and dX in e4m3; dW in high precision.
    MXFP8_HP_WGRAD = "mxfp8_hp_wgrad"
    # Y in e2m3; dX and dW take grad_output in e3m2. Emulated GEMMs (no fp6 MMA).
    MXFP6 = "mxfp6"
    # Y, dX, dW in e2m1. cuBLAS on sm100, else emulated.
    MXFP4 = "mxfp4"


@dataclass(frozen=True, kw_only=True)
class MXLinearConfig:
    """How an :class:`mx_nn.MXLinear` casts and multiplies (GEMM table in the module doc)."""

    input_fmt: str = "fp8_e4m3"
    """Element format of the input X (Y and dW GEMMs)."""
    weight_fmt: str = "fp8_e4m3"
    """Element format of the weight W (Y and dX GEMMs)."""
    grad_output_fmt: str = "fp8_e4m3"
    """Element format of the output gradient dY (dX and dW GEMMs)."""
    block_size: int = 32
    """Elements per E8M0 scale."""
    scale_mode: str = "rceil"
    """``"floor"``, ``"ceil"``, ``"even"`` or ``"rceil"`` (mx_core.ScaleMode)."""
    gemm_backend: str = "auto"
    """``mx_kernels.scaled_mm`` backend: auto, cublas, triton or emulated."""
    cast_backend: str = "auto"
    """Cast backend: auto, triton or reference."""
    hp_weight_grad: bool = False
    """Compute dW = dY^T X in the high-precision dtype instead of MX."""
    save_mx_activations: bool = False
    """Keep X's columnwise MX cast (codes and scales, about half of X's bf16 bytes) for
    backward: runs the MX path where "auto" would run the fused one (which keeps
    bf16 values). The MX path keeps that cast in every case where it computes the MX dW
    GEMM."""
    compute_path: str = "auto"
    """``"auto"``, ``"mx"`` or ``"fake_quant"`` (module doc). ``"fake_quant"`` runs the
    fused path on any device, CPU included (how CPU tests cover it); it takes no fp16
    input, whose fake-quantized values can leave fp16's range."""
    reuse_weight_casts: bool = False
    """Deprecated, no effect (a FutureWarning says so): casts kept across calls by a
    config outlived the step they were made in, and a weight written without bumping
    its version counter (``.data``) got its old casts. Wrap the micro-batches of one
    gradient-accumulation step in ``with mx_nn.keep_weight_casts():`` instead."""

    def __post_init__(self) -> None:
        for name in ("input_fmt", "weight_fmt", "grad_output_fmt"):
            get_format(getattr(self, name), arg=name)
        get_scale_mode(self.scale_mode)
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
            raise TypeError(f"block_size must be an int, got {type(self.block_size).__name__}")
        if self.block_size <= 0 or self.block_size % 2:
            raise ValueError(f"block_size={self.block_size} must be a positive multiple of 2")
        if self.gemm_backend not in MATMUL_BACKENDS:
            raise ValueError(
                f"gemm_backend={self.gemm_backend!r} is not one of {', '.join(MATMUL_BACKENDS)}"
            )
        if self.cast_backend not in BACKENDS:
            raise ValueError(
                f"cast_backend={self.cast_backend!r} is not one of {', '.join(BACKENDS)}"
            )
        for name in ("hp_weight_grad", "save_mx_activations", "reuse_weight_casts"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.compute_path not in COMPUTE_PATHS:
            raise ValueError(
                f"compute_path={self.compute_path!r} is not one of {', '.join(COMPUTE_PATHS)}"
            )
        if self.reuse_weight_casts:
            warnings.warn(
                "MXLinearConfig(reuse_weight_casts=True) has no effect: wrap the "
                "micro-batches of one step in `with mx_nn.keep_weight_casts():` instead",
                FutureWarning,
                stacklevel=3,
            )
        if self.compute_path == "fake_quant" and self.save_mx_activations:
            raise ValueError(
                "compute_path='fake_quant' keeps no MX casts, so save_mx_activations=True "
                "cannot apply; use compute_path='mx' or 'auto'"
            )

    @property
    def scale_mode_name(self) -> str:
        """The scale mode as its canonical lower-case name."""
        if torch.compiler.is_compiling():
            return get_scale_mode(self.scale_mode).value
        # Asked several times per layer call: a dict lookup instead of an enum's lookup.
        name = _MODE_NAMES.get(self.scale_mode)
        if name is None:
            name = _MODE_NAMES[self.scale_mode] = get_scale_mode(self.scale_mode).value
        return name

    @property
    def needs_colwise_input(self) -> bool:
        """Whether backward needs X cast along M (the MX dW GEMM)."""
        return not self.hp_weight_grad

    @classmethod
    def from_recipe(cls, recipe: str | MXRecipe, **overrides) -> MXLinearConfig:
        """The config of a named recipe, with any field overridden by keyword.

        Raises:
            ValueError: unknown recipe name (the message lists the recipes).
        """
        try:
            r = MXRecipe(recipe)
        except ValueError:
            names = ", ".join(m.value for m in MXRecipe)
            raise ValueError(f"recipe={recipe!r} is not a recipe; allowed: {names}") from None
        fields = _RECIPES[r]
        return cls(**{**fields, **overrides})


_RECIPES: dict[MXRecipe, dict] = {
    MXRecipe.MXFP8: {},
    MXRecipe.MXFP8_FLOOR: {"scale_mode": "floor"},
    MXRecipe.MXFP8_E5M2_GRADS: {"grad_output_fmt": "fp8_e5m2"},
    MXRecipe.MXFP8_HP_WGRAD: {"hp_weight_grad": True},
    MXRecipe.MXFP6: {
        "input_fmt": "fp6_e2m3",
        "weight_fmt": "fp6_e2m3",
        "grad_output_fmt": "fp6_e3m2",
    },
    MXRecipe.MXFP4: {
        "input_fmt": "fp4_e2m1",
        "weight_fmt": "fp4_e2m1",
        "grad_output_fmt": "fp4_e2m1",
    },
}
