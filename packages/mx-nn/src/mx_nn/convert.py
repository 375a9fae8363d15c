"""``convert``: swap a model's ``nn.Linear`` layers for :class:`MXLinear` in place."""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.linear import MXLinear

__all__ = ["convert"]

logger = logging.getLogger("mx_nn")


def _config(recipe_or_config: str | MXRecipe | MXLinearConfig) -> MXLinearConfig:
    if isinstance(recipe_or_config, MXLinearConfig):
        return recipe_or_config
    return MXLinearConfig.from_recipe(recipe_or_config)


def convert(
    model: nn.Module,
    recipe_or_config: str | MXRecipe | MXLinearConfig = "mxfp8",
    *,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> nn.Module:
    """Replace every ``nn.Linear`` (exactly that type) in ``model`` by an ``MXLinear``
    sharing its Parameter objects, so state_dict keys and dtypes stay the same.

    Layers whose in/out features are not multiples of the block size are kept, and
    logged by name at INFO on the ``mx_nn`` logger. ``filter_fn(module, fqn)`` returning
    False keeps a layer too. Converting twice changes nothing. Returns ``model`` (or the
    new module when ``model`` itself is an ``nn.Linear``).
    """
    config = _config(recipe_or_config)

    def swap(module: nn.Module, fqn: str) -> nn.Module | None:
        if type(module) is not nn.Linear:
            return None
        if filter_fn is not None and not filter_fn(module, fqn):
            return None
        bs = config.block_size
        if module.in_features % bs or module.out_features % bs:
            logger.info(
                "mx_nn.convert: kept %s as nn.Linear (in_features=%d, out_features=%d are "
                "not multiples of block_size=%d)",
                fqn or "<root>",
                module.in_features,
                module.out_features,
                bs,
            )
            return None
        return MXLinear.from_linear(module, config, fqn=fqn or None)

    root = swap(model, "")
    if root is not None:
        return root
    for parent_fqn, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            fqn = f"{parent_fqn}.{name}" if parent_fqn else name
            new = swap(child, fqn)
            if new is not None:
                setattr(parent, name, new)
    return model
