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

import dataclasses
import enum
import warnings
from dataclasses import dataclass

import torch

from mx_core import (
    CastBackend,
    CastSettings,
    ComputePath,
    ElementFormatName,
    MatmulBackend,
    ScaleMode,
)
from mx_core.choices import Choice

__all__ = ["COMPUTE_PATHS", "MXLinearConfig", "MXRecipe"]

COMPUTE_PATHS: tuple[str, ...] = ComputePath.choices()
"""Values of :attr:`MXLinearConfig.compute_path` (see the module doc)."""

# Scale mode member -> its value: asked several times per layer call, and a dict lookup
# costs ~15 ns where the enum's ``.value`` costs ~115 ns.
_MODE_NAMES: dict[ScaleMode, str] = {m: m.value for m in ScaleMode}


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


@dataclass(frozen=True, kw_only=True, repr=False)
class MXLinearConfig:
    """How an :class:`mx_nn.MXLinear` casts and multiplies (GEMM table in the module doc).

    The named choices may be given as their strings (or ``mx_core.choices`` members;
    a format also as an mx-core ``ElementFormat``); they are stored as enum members,
    which are ``str`` and compare equal to the strings: ``config.input_fmt == "fp8_e4m3"``.

    Raises:
        TypeError: a choice that is not a string, ``block_size`` not an int, or a flag
            not a bool.
        ValueError: an unknown choice (the message names the field, the value and the
            allowed values), ``block_size`` not a positive multiple of 2, or
            ``compute_path="fake_quant"`` with ``save_mx_activations=True``.
    """

    input_fmt: ElementFormatName = ElementFormatName.FP8_E4M3
    """Element format of the input X (Y and dW GEMMs)."""
    weight_fmt: ElementFormatName = ElementFormatName.FP8_E4M3
    """Element format of the weight W (Y and dX GEMMs)."""
    grad_output_fmt: ElementFormatName = ElementFormatName.FP8_E4M3
    """Element format of the output gradient dY (dX and dW GEMMs)."""
    block_size: int = 32
    """Elements per E8M0 scale."""
    scale_mode: ScaleMode = ScaleMode.RCEIL
    """``"floor"``, ``"ceil"``, ``"even"`` or ``"rceil"`` (mx_core.ScaleMode)."""
    gemm_backend: MatmulBackend = MatmulBackend.AUTO
    """``mx_kernels.scaled_mm`` backend: auto, cublas, triton or emulated."""
    cast_backend: CastBackend = CastBackend.AUTO
    """Cast backend: auto, triton or reference."""
    hp_weight_grad: bool = False
    """Compute dW = dY^T X in the high-precision dtype instead of MX."""
    save_mx_activations: bool = True
    """Keep for backward X's columnwise MX cast (codes and scales, about half of X's
    bf16 bytes) where backward computes the MX dW, on both paths: the fused path
    decodes it for its bf16 dW GEMM (the same values as its fake-quantized cast, bit
    for bit) and casts W along N in backward instead of keeping that cast from forward.
    False keeps the fused path's fake-quantized values in X's dtype instead (one cast
    launch and one decode fewer per layer, twice the memory). The MX path keeps the MX
    cast either way."""
    compute_path: ComputePath = ComputePath.AUTO
    """``"auto"``, ``"mx"`` or ``"fake_quant"`` (module doc). ``"fake_quant"`` runs the
    fused path on any device, CPU included (how CPU tests cover it); it takes no fp16
    input, whose fake-quantized values can leave fp16's range."""
    reuse_weight_casts: bool = False
    """Deprecated, no effect (a FutureWarning says so): casts kept across calls by a
    config outlived the step they were made in, and a weight written without bumping
    its version counter (``.data``) got its old casts. Wrap the micro-batches of one
    gradient-accumulation step in ``with mx_nn.keep_weight_casts():`` instead."""

    def __post_init__(self) -> None:
        # Normalising only: each choice keeps the value it was given, as its enum member.
        for name, choice in _CHOICES.items():
            object.__setattr__(self, name, choice.parse(getattr(self, name), arg=name))
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
            raise TypeError(f"block_size must be an int, got {type(self.block_size).__name__}")
        if self.block_size <= 0 or self.block_size % 2:
            raise ValueError(f"block_size={self.block_size} must be a positive multiple of 2")
        for name in ("hp_weight_grad", "save_mx_activations", "reuse_weight_casts"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.reuse_weight_casts:
            warnings.warn(
                "MXLinearConfig(reuse_weight_casts=True) has no effect: wrap the "
                "micro-batches of one step in `with mx_nn.keep_weight_casts():` instead",
                FutureWarning,
                stacklevel=3,
            )

    def __repr__(self) -> str:
        # The fields' plain values, as the dataclass repr showed them when they were strings.
        fields = ", ".join(
            f"{f.name}={_plain(getattr(self, f.name))!r}" for f in dataclasses.fields(self)
        )
        return f"MXLinearConfig({fields})"

    @property
    def scale_mode_name(self) -> str:
        """The scale mode as a plain ``str``, e.g. ``"rceil"``."""
        if torch.compiler.is_compiling():
            return self.scale_mode.value
        return _MODE_NAMES[self.scale_mode]

    def _cast(self, fmt: ElementFormatName) -> CastSettings:
        return CastSettings(
            fmt=fmt, block_size=self.block_size, scale_mode=self.scale_mode,
            backend=self.cast_backend,
        )  # fmt: skip

    @property
    def input_cast(self) -> CastSettings:
        """The casts of the input X: ``input_fmt`` with the shared block size, scale mode
        and ``cast_backend`` (a new value on each access)."""
        return self._cast(self.input_fmt)

    @property
    def weight_cast(self) -> CastSettings:
        """The casts of the weight W: ``weight_fmt`` with the shared settings."""
        return self._cast(self.weight_fmt)

    @property
    def grad_output_cast(self) -> CastSettings:
        """The casts of the output gradient dY: ``grad_output_fmt`` with the shared
        settings."""
        return self._cast(self.grad_output_fmt)

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


_CHOICES: dict[str, type[Choice]] = {
    "input_fmt": ElementFormatName,
    "weight_fmt": ElementFormatName,
    "grad_output_fmt": ElementFormatName,
    "scale_mode": ScaleMode,
    "gemm_backend": MatmulBackend,
    "cast_backend": CastBackend,
    "compute_path": ComputePath,
}
"""The fields that hold a named choice, and the enum each is parsed with."""


def _plain(value: object) -> object:
    return value.value if isinstance(value, Choice) else value


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
