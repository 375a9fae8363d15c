"""The two compressed-tensors MX layouts an export writes, and their ``quantization_config``.

As compressed-tensors 0.20 reads them (``compressors/mxfp8/base.py``,
``compressors/mxfp4/base.py``, ``compressors/mx_utils.py``, ``quantization/quant_scheme.py``):

==========  =========================  ===========================================
scheme      ``format``                 tensors of each quantized linear ``<m>``
==========  =========================  ===========================================
mxfp8       ``mxfp8-quantized``        ``<m>.weight`` float8_e4m3fn [out, in];
                                       ``<m>.weight_scale`` uint8 [out, in / 32]
mxfp4       ``mxfp4-pack-quantized``   ``<m>.weight_packed`` uint8 [out, in / 2], the
                                       even element in the low nibble;
                                       ``<m>.weight_scale`` uint8 [out, in / 32]
==========  =========================  ===========================================

A scale byte is the E8M0 exponent (bias 127): compressed-tensors decodes it as
``2 ** (byte - 127)``. A bias stays ``<m>.bias`` as it is. The config names one group
targeting every ``Linear``, weights static (group 32, symmetric, float, uint8 scales)
and input activations dynamic in the same element format (compressed-tensors' MXFP8
and MXFP4 presets), and ``ignore`` lists the modules kept in high precision.
"""

from __future__ import annotations

from dataclasses import dataclass

from mx_core import ElementFormatName
from mx_nn.config import MXLinearConfig

__all__ = [
    "BLOCK",
    "COMPRESSED_TENSORS_VERSION",
    "SCHEMES",
    "Scheme",
    "get_scheme",
    "scheme_for_recipe",
    "scheme_from_config",
    "scheme_of_format",
]

COMPRESSED_TENSORS_VERSION = "0.20.1"
"""The compressed-tensors release whose layout this module writes (config ``version``)."""
BLOCK = 32
"""Elements per E8M0 scale in both layouts (compressed-tensors' ``group_size``)."""


@dataclass(frozen=True, kw_only=True)
class Scheme:
    """One compressed-tensors MX layout (module doc)."""

    name: str
    """``"mxfp8"`` or ``"mxfp4"``."""
    fmt: ElementFormatName
    """The element format of the weights (and of the served activations)."""
    format: str
    """compressed-tensors' ``format`` string."""
    codes_name: str
    """Suffix of the codes tensor: ``"weight"`` or ``"weight_packed"``."""
    num_bits: int

    @property
    def scale_name(self) -> str:
        """Suffix of the E8M0 scale tensor."""
        return "weight_scale"

    def _args(self, dynamic: bool) -> dict:
        return {"num_bits": self.num_bits, "type": "float", "symmetric": True,
                "group_size": BLOCK, "strategy": "group", "dynamic": dynamic,
                "scale_dtype": "torch.uint8"}  # fmt: skip

    def quantization_config(self, ignore: list[str]) -> dict:
        """config.json's ``quantization_config`` for this layout, ``ignore`` listing the
        modules (Hugging Face names) stored in high precision."""
        group = {"targets": ["Linear"], "weights": self._args(False),
                 "input_activations": self._args(True), "output_activations": None,
                 "format": self.format}  # fmt: skip
        return {
            "config_groups": {"group_0": group},
            "format": self.format,
            "global_compression_ratio": None,
            "ignore": list(ignore),
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "version": COMPRESSED_TENSORS_VERSION,
        }


SCHEMES: dict[str, Scheme] = {
    "mxfp8": Scheme(name="mxfp8", fmt=ElementFormatName.FP8_E4M3, format="mxfp8-quantized",
                    codes_name="weight", num_bits=8),
    "mxfp4": Scheme(name="mxfp4", fmt=ElementFormatName.FP4_E2M1,
                    format="mxfp4-pack-quantized", codes_name="weight_packed", num_bits=4),
}  # fmt: skip
"""The schemes by name."""


def get_scheme(name: object) -> Scheme:
    """Look a scheme up by name.

    Args:
        name: ``"mxfp8"`` or ``"mxfp4"`` (a :class:`Scheme` passes through).
    Returns:
        The :class:`Scheme`.
    Raises:
        ValueError: not one of :data:`SCHEMES` (the message lists them).
    """
    if isinstance(name, Scheme):
        return name
    if not isinstance(name, str) or name not in SCHEMES:
        raise ValueError(f"scheme={name!r} is not an export scheme; allowed: {', '.join(SCHEMES)}")
    return SCHEMES[name]


def scheme_from_config(quantization_config: dict) -> Scheme:
    """The scheme of a compressed-tensors config, for loading one back.

    Args:
        quantization_config: config.json's ``quantization_config`` dict.
    Returns:
        The :class:`Scheme` of its ``format``.
    Raises:
        ValueError: a quantization method or format other than the two MX layouts, or
            groups that are not one MX scheme with group size 32.
    """
    method = quantization_config.get("quant_method")
    fmt = quantization_config.get("format")
    by_format = {s.format: s for s in SCHEMES.values()}
    if method != "compressed-tensors" or fmt not in by_format:
        allowed = ", ".join(by_format)
        raise ValueError(
            f"quantization_config has quant_method={method!r}, format={fmt!r}; loadable: "
            f"compressed-tensors with format {allowed}"
        )
    scheme = by_format[fmt]
    for name, group in quantization_config.get("config_groups", {}).items():
        weights = group.get("weights") or {}
        got = (weights.get("num_bits"), weights.get("type"), weights.get("group_size"))
        if group.get("format", fmt) != fmt or got != (scheme.num_bits, "float", BLOCK):
            raise ValueError(
                f"quantization_config group {name!r}: weights {got} in format "
                f"{group.get('format')!r}; {scheme.name} needs ({scheme.num_bits}, 'float', "
                f"{BLOCK}) in {fmt!r}"
            )
    return scheme


def scheme_of_format(weight_fmt: str) -> Scheme:
    """The scheme that stores weights of one element format.

    Args:
        weight_fmt: an element format's name (``"fp8_e4m3"``, ``"fp4_e2m1"``) or
            ``ElementFormatName``.
    Returns:
        The :class:`Scheme` whose ``fmt`` it is.
    Raises:
        ValueError: a format neither layout stores (the message names both).
    """
    for scheme in SCHEMES.values():
        if scheme.fmt == weight_fmt:
            return scheme
    stored = ", ".join(f"{s.fmt.value} ({s.name})" for s in SCHEMES.values())
    raise ValueError(f"weights in {weight_fmt} have no serving export; it stores {stored}")


def scheme_for_recipe(recipe: str) -> Scheme:
    """The scheme of the weights an mx-nn recipe trains.

    Args:
        recipe: an mx-nn recipe name (``"mxfp8_floor"``...).
    Returns:
        The :class:`Scheme` of its weight format (``"mxfp8_floor"`` -> mxfp8).
    Raises:
        ValueError: an unknown recipe, or one whose weights neither layout stores
            (mxfp6).
    """
    weight_fmt = MXLinearConfig.from_recipe(recipe).weight_fmt
    try:
        return scheme_of_format(weight_fmt)
    except ValueError as e:
        raise ValueError(f"recipe {recipe!r}: {e}") from None
