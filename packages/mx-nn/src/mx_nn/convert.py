"""``convert``: swap a model's ``nn.Linear`` layers for :class:`MXLinear` in place."""

from __future__ import annotations

import dataclasses
import logging
import reprlib
from collections.abc import Callable

from torch import nn
from torch.distributed.tensor import DTensor

from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.linear import MXLinear, share_input_casts

__all__ = ["convert"]

logger = logging.getLogger("mx_nn")

_SHOWN = 8  # layers a message names before it only counts the rest


def _config(recipe_or_config: str | MXRecipe | MXLinearConfig) -> MXLinearConfig:
    if isinstance(recipe_or_config, MXLinearConfig):
        return recipe_or_config
    if not isinstance(recipe_or_config, str):  # MXRecipe is a str enum
        raise TypeError(
            f"recipe_or_config must be a recipe name (str), an MXRecipe or an MXLinearConfig, "
            f"got {recipe_or_config!r} ({type(recipe_or_config).__name__})"
        )
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
    False keeps a layer as it is (it is asked of the MXLinear layers too). Every check
    runs before the first layer is swapped: a refused call leaves ``model`` as it was.
    Every module with two or more MXLinear children then gets a cast scope, in which the
    children reading one input share its casts (:func:`mx_nn.share_input_casts`).

    Converting again: an MXLinear whose config equals the requested one stays as it is
    (converting twice with one config changes nothing). One with another config is
    refused, not re-configured: layers converted earlier keep the numerics they were
    set up (and maybe trained) with, unless ``filter_fn`` leaves them out.

    Args:
        model: the module to convert (``nn.Module``), in place.
        recipe_or_config: a recipe name or ``MXRecipe`` (``MXLinearConfig.from_recipe``),
            or an ``MXLinearConfig``.
        filter_fn: ``(module, fqn) -> bool``; None converts every layer it can.

    Returns:
        ``model``, or the new module when ``model`` itself is an ``nn.Linear``.

    Raises:
        TypeError: ``model`` not an ``nn.Module``, ``recipe_or_config`` of another type,
            ``filter_fn`` not callable or returning something other than a bool.
        ValueError: an unknown recipe name; layers already MXLinear with another config
            (named, with both configs); a linear to convert whose parameters are
            DTensors (convert before tensor parallelism or FSDP2, as
            ``mx_nn.parallelize`` does) or that has forward or backward hooks, which
            the new module would not run.

    Example:
        >>> model = convert(nn.Sequential(nn.Linear(64, 64)), "mxfp8")
        >>> type(model[0]).__name__
        'MXLinear'
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {reprlib.repr(model)} ({type(model).__name__})"
        )
    config = _config(recipe_or_config)
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(
            f"filter_fn must be a callable (module, fqn) -> bool or None, got {filter_fn!r}"
        )

    def keep(module: nn.Module, fqn: str) -> bool:
        if filter_fn is None:
            return False
        verdict = filter_fn(module, fqn)
        if not isinstance(verdict, bool):
            # A filter that forgets its return (None) would keep every layer silently.
            raise TypeError(
                f"filter_fn must return a bool, returned {verdict!r} for {fqn or '<root>'!r}"
            )
        return not verdict

    # (parent or None for the root, attribute name, new module); the new modules are
    # made first and set into the model only after every layer passed its checks.
    swaps: list[tuple[nn.Module | None, str, nn.Module]] = []
    made: dict[int, MXLinear] = {}  # one MXLinear per linear, however often it is reached
    conflicts: dict[MXLinearConfig, list[str]] = {}
    for fqn, parent, name, module in _layers(model):
        if isinstance(module, MXLinear):
            if module.config != config and not keep(module, fqn):
                conflicts.setdefault(module.config, []).append(fqn or "<root>")
            continue
        if type(module) is not nn.Linear or keep(module, fqn):
            continue
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
            continue
        if id(module) not in made:
            _check_swappable(module, fqn)
            made[id(module)] = MXLinear.from_linear(module, config, fqn=fqn or None)
        swaps.append((parent, name, made[id(module)]))
    if conflicts:
        raise ValueError(_conflict_message(conflicts, config))
    for parent, name, new in swaps:
        if parent is None:
            return new
        setattr(parent, name, new)
    share_input_casts(model)
    return model


def _layers(model: nn.Module):
    """(fqn, parent or None, attribute name, module) of ``model`` itself and of every
    child of every module in it, a child held under two names once per name
    (``named_children`` would give it once, and the other name would keep the old one)."""
    yield "", None, "", model
    for parent_fqn, parent in model.named_modules():
        for name, child in parent._modules.items():
            if child is not None:
                yield (f"{parent_fqn}.{name}" if parent_fqn else name), parent, name, child


def _check_swappable(linear: nn.Linear, fqn: str) -> None:
    who = fqn or "<root>"
    dtensors = [n for n, p in linear.named_parameters(recurse=False) if isinstance(p, DTensor)]
    if dtensors:
        raise ValueError(
            f"convert cannot swap {who}: its {', '.join(dtensors)} are DTensors (tensor "
            f"parallelism or FSDP2 ran on it; their hooks stay on the nn.Linear). Convert "
            f"before parallelizing (mx_nn.parallelize converts first)"
        )
    hooks = [
        kind
        for kind, registered in (
            ("forward", linear._forward_hooks),
            ("forward pre", linear._forward_pre_hooks),
            ("backward", linear._backward_hooks),
            ("backward pre", linear._backward_pre_hooks),
        )
        if registered
    ]
    if hooks:
        raise ValueError(
            f"convert cannot swap {who}: it has {' and '.join(hooks)} hooks, which the new "
            f"MXLinear would not run. Convert before registering them, or leave the layer "
            f"out with filter_fn"
        )


def _conflict_message(conflicts: dict[MXLinearConfig, list[str]], config: MXLinearConfig) -> str:
    n = sum(len(fqns) for fqns in conflicts.values())
    groups = []
    for existing, fqns in conflicts.items():
        shown = ", ".join(repr(f) for f in fqns[:_SHOWN])
        more = f" and {len(fqns) - _SHOWN} more" if len(fqns) > _SHOWN else ""
        differ = [
            f"{f.name}={getattr(existing, f.name)!r} (requested {getattr(config, f.name)!r})"
            for f in dataclasses.fields(config)
            if getattr(existing, f.name) != getattr(config, f.name)
        ]
        groups.append(f"{shown}{more} have {existing!r}, differing in {', '.join(differ)}")
    return (
        f"convert: {n} layer(s) are already MXLinear with another config than the requested "
        f"{config!r}: {'; '.join(groups)}. convert does not re-configure layers; convert a "
        f"fresh model, or leave these layers out with filter_fn"
    )
