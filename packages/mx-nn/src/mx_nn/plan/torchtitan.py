"""mxstack as a torchtitan 0.3 model converter.

torchtitan 0.3 converts a model in its config tree, before building it
(``torchtitan.protocols.model.ModelConfigConverter``): its float8 and MXFP8 converters
replace ``Linear.Config`` nodes by the configs of their own linear modules, and
``model_registry(flavor, converters=[...])`` runs the converters a ``config_registry``
function lists. The trainer then builds the model on the meta device, checks that every
module is a torchtitan ``Module``, shards each by its ``sharding_config`` and initialises
each by its ``param_init``. The plain :class:`~mx_nn.MXLinear` that ``mx_nn.convert``
would put into the built model keeps none of the three, so the swap is made in the
config tree too: each plain ``Linear.Config`` becomes a :class:`TitanMXLinear` config
with the same fields, and the model is built with MX linears.

- :class:`MXStackConverter`: the converter, for ``config_registry`` functions;
- :func:`mxstack`: the same swap for the decoder layers' linears as a torchtitan
  override, picked by name on the command line:
  ``--override.imports mx_nn.plan.torchtitan.mxstack``. It is registered when this
  module is imported (which that flag does); importing ``mx_nn`` does not import it.

Which linears: a ``Linear.Config`` exactly (subclasses build other modules: a
row-parallel GEMM, float8, LoRA), with in/out features multiples of the block size and,
for the converter, an FQN that no ``filter_fqns`` entry is a substring of (torchtitan's
float8 rule; the default keeps the LM head, ``lm_head``, in high precision). Every
other linear is left alone with one INFO line on the ``mx_nn`` logger.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from torchtitan.components.quantization import QuantizationConverter
from torchtitan.config.override import override
from torchtitan.models.common.linear import Linear
from torchtitan.protocols.module import Module

from mx_nn.config import MXLinearConfig
from mx_nn.convert import block_size_reason
from mx_nn.linear import MXLinear

__all__ = ["MXStackConverter", "TitanMXLinear", "mxstack"]

logger = logging.getLogger("mx_nn")


class TitanMXLinear(MXLinear, Module):
    """:class:`~mx_nn.MXLinear` as a torchtitan ``Module``: built from its ``Config``,
    initialised by the config's ``param_init`` and sharded by its ``sharding_config``
    as torchtitan's ``Linear`` is. Same parameters and state_dict keys as ``Linear``."""

    @dataclass(kw_only=True, slots=True)
    class Config(Linear.Config):
        """``Linear.Config``'s fields, plus ``mx`` (the layer's :class:`MXLinearConfig`)
        and ``fqn`` (its name in the model, which errors quote; None when unknown)."""

        mx: MXLinearConfig = field(default_factory=MXLinearConfig)
        fqn: str | None = None

    def __init__(self, config: Config) -> None:
        MXLinear.__init__(
            self,
            config.in_features,
            config.out_features,
            bias=config.bias,
            config=config.mx,
            fqn=config.fqn,
        )


def _mx_config(recipe: object) -> MXLinearConfig:
    if not isinstance(recipe, str):
        raise TypeError(f"recipe must be a recipe name (str), got {recipe!r}")
    return MXLinearConfig.from_recipe(recipe)  # names the allowed recipes


def _checked_fqns(filter_fqns: object) -> tuple[str, ...]:
    if not isinstance(filter_fqns, (list, tuple)) or not all(
        isinstance(f, str) for f in filter_fqns
    ):
        raise TypeError(f"filter_fqns must be a list of FQN strings, got {filter_fqns!r}")
    if "" in filter_fqns:
        raise ValueError(f"filter_fqns={filter_fqns!r}: an empty entry would match every FQN")
    return tuple(filter_fqns)


def _why_not(cfg: Linear.Config, config: MXLinearConfig) -> str | None:
    """Why the linear of ``cfg`` stays as it is, or None when it becomes MX."""
    if type(cfg) is not Linear.Config:
        return f"its config is a {type(cfg).__qualname__}, not torchtitan's Linear.Config"
    return block_size_reason(cfg.in_features, cfg.out_features, config.block_size)


def _mx_linear(cfg: Linear.Config, config: MXLinearConfig, fqn: str | None):
    """``cfg`` (a plain ``Linear.Config``) as a ``TitanMXLinear.Config``: every field
    carried (``param_init`` and ``sharding_config`` among them)."""
    kept = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    return TitanMXLinear.Config(**kept, mx=config, fqn=fqn)


class MXStackConverter(QuantizationConverter):
    """Sets torchtitan's plain linears to :class:`TitanMXLinear` in the model config
    tree (module doc), as torchtitan's own quantization converters do: list its
    ``Config`` in ``model_registry(flavor, converters=[...])``, before LoRA.
    ``model_compile_enabled`` (the base config's) is not read: MXLinear runs eager or
    compiled.

    Raises:
        TypeError: ``recipe`` not a str, ``filter_fqns`` not a list of str.
        ValueError: an unknown recipe (the message lists the recipes), an empty
            ``filter_fqns`` entry.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(QuantizationConverter.Config):
        recipe: str = "mxfp8"
        """The MX recipe of the converted linears (``mx_nn.MXRecipe``)."""

        filter_fqns: list[str] = field(default_factory=lambda: ["lm_head"])
        """Linears kept in high precision: those whose FQN contains one of these.
        The default keeps the LM head; ``[]`` converts it too."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.mx_config = _mx_config(config.recipe)
        self.filter_fqns = _checked_fqns(config.filter_fqns)

    def convert(self, model_config: Module.Config) -> Module.Config:
        """Replace, in place, the ``Linear.Config`` nodes of ``model_config`` that
        become MX (module doc) by ``TitanMXLinear.Config`` nodes.

        Args:
            model_config: the model's root config (e.g. a ``Llama3Model.Config``).

        Returns:
            ``model_config``, or the new config when the root itself is a linear.

        Raises:
            ValueError: linears already ``TitanMXLinear`` with another MX config
                (named, with both configs); nothing is replaced then.
        """
        config, root = self.mx_config, model_config
        swaps: list[tuple[object | None, str | int | None, TitanMXLinear.Config]] = []
        alone: list[tuple[str, str]] = []  # (fqn, why), logged once no conflict refused
        conflicts: list[str] = []
        n_linears = n_mx = 0
        for fqn, cfg, parent, attr in model_config.traverse(Linear.Config):
            n_linears += 1
            why = next((f"filter_fqns entry {f!r}" for f in self.filter_fqns if f in fqn), None)
            if why is None and isinstance(cfg, TitanMXLinear.Config):
                if cfg.mx == config:
                    n_mx += 1
                else:
                    conflicts.append(f"{fqn or '<root>'!r} has {cfg.mx!r}")
                continue
            why = why or _why_not(cfg, config)
            if why is not None:
                alone.append((fqn, why))
                continue
            swaps.append((parent, attr, _mx_linear(cfg, config, fqn or None)))
            n_mx += 1
        if conflicts:
            raise ValueError(
                f"MXStackConverter(recipe={self.config.recipe!r}): linears already "
                f"TitanMXLinear with another config than {config!r}: {'; '.join(conflicts)}. "
                f"Layers are not re-configured; leave them out with filter_fqns"
            )
        for fqn, why in alone:
            logger.info("mx_nn.plan.torchtitan: %s left alone: %s", fqn or "<root>", why)
        for parent, attr, new in swaps:
            if parent is None:
                root = new
            elif isinstance(parent, list):
                parent[attr] = new
            else:
                setattr(parent, attr, new)
        logger.info(
            "mx_nn.plan.torchtitan: %d of %d linears set to MXLinear (%s); %d left alone",
            n_mx,
            n_linears,
            self.config.recipe,
            len(alone),
        )
        return root


@override(
    target=Linear.Config,
    fqns=["*layers.*"],
    exact=True,
    description="mxstack: the decoder layers' linears as mx_nn MXLinear",
)
def mxstack(cfg: Linear.Config, *, recipe: str = "mxfp8") -> Linear.Config:
    """The torchtitan override ``mx_nn.plan.torchtitan.mxstack``: a plain
    ``Linear.Config`` under the decoder's ``layers`` as a ``TitanMXLinear.Config``
    (the LM head and linears outside ``layers`` are not claimed). The recipe comes from
    the override's kwargs: ``--override.imports
    'mx_nn.plan.torchtitan.mxstack={"recipe": "mxfp4"}'``.

    Args:
        cfg: the claimed ``Linear.Config``.
        recipe: the MX recipe (``mx_nn.MXRecipe``).

    Returns:
        The ``TitanMXLinear.Config``, or ``cfg`` itself when its features are not
        multiples of the block size (one INFO line says so).

    Raises:
        TypeError, ValueError: as :class:`MXStackConverter` for ``recipe``.
    """
    config = _mx_config(recipe)
    why = _why_not(cfg, config)
    if why is not None:
        logger.info("mx_nn.plan.torchtitan.mxstack: a linear left alone: %s", why)
        return cfg
    return _mx_linear(cfg, config, None)
