"""``convert``: swap a model's linear layers for :class:`MXLinear` in place.

A linear is converted when it is an ``nn.Linear`` (a subclass too) that computes
``x @ W^T + b`` with nn.Linear's own forward, and holds only ``weight`` and ``bias``;
every other linear is left alone and named, with the reason, in one INFO line on the
``mx_nn`` logger, then one line sums up what the call did.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import reprlib
from collections.abc import Callable

from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from mx_nn.casts.compute_path import check_gemm_backends
from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.linear import MXLinear, share_input_casts

__all__ = ["convert", "convertible"]

logger = logging.getLogger("mx_nn")

_SHOWN = 8  # layers a message names before it only counts the rest
_LINEAR_STATE = {"weight", "bias"}  # nn.Linear's parameters, all that an MXLinear keeps


def _config(recipe_or_config: str | MXRecipe | MXLinearConfig) -> MXLinearConfig:
    if isinstance(recipe_or_config, MXLinearConfig):
        return recipe_or_config
    if not isinstance(recipe_or_config, str):  # MXRecipe is a str enum
        raise TypeError(
            f"recipe_or_config must be a recipe name (str), an MXRecipe or an MXLinearConfig, "
            f"got {recipe_or_config!r} ({type(recipe_or_config).__name__})"
        )
    return MXLinearConfig.from_recipe(recipe_or_config)


def _not_plain(module: nn.Linear) -> str | None:
    """Why ``module``'s type or state keeps it from becoming an MXLinear, or None."""
    cls = type(module)
    if cls.forward is not nn.Linear.forward:
        # Its forward may do more than x @ W^T + b, which is all an MXLinear does.
        return f"overrides forward ({cls.__qualname__})"
    if "forward" in module.__dict__:  # set on the instance (wrapping frameworks do)
        return f"overrides forward (set on the {cls.__qualname__} instance)"
    if issubclass(cls, NonDynamicallyQuantizableLinear):
        # nn.MultiheadAttention's out_proj: its parent reads .weight and never calls it,
        # so as an MXLinear it would be counted as MX and still run in high precision.
        return "never called (nn.MultiheadAttention reads its weight directly)"
    extra = [
        *(n for n in module._parameters if n not in _LINEAR_STATE),
        *module._buffers,
        *module._modules,
    ]
    if extra:
        # The MXLinear would drop them from the model and its state_dict.
        return f"holds more than weight and bias ({', '.join(extra)})"
    return None


def _not_convertible(module: nn.Linear, config: MXLinearConfig) -> str | None:
    why = _not_plain(module)
    if why is not None:
        return why
    return block_size_reason(module.in_features, module.out_features, config.block_size)


def block_size_reason(in_features: int, out_features: int, block_size: int) -> str | None:
    """Why a linear of these features cannot be MX with ``block_size``, or None."""
    if in_features % block_size or out_features % block_size:
        return (
            f"features not multiples of the block size (in_features={in_features}, "
            f"out_features={out_features}, block size {block_size})"
        )
    return None


def convertible(module: nn.Module, config: MXLinearConfig) -> bool:
    """Whether :func:`convert` with ``config`` would swap ``module`` for an MXLinear
    (``filter_fn`` aside): an ``nn.Linear`` or subclass, not an MXLinear already, with
    nn.Linear's forward, only ``weight`` and ``bias`` as state, and in/out features
    multiples of ``config.block_size``.

    Args:
        module: any module.
        config: the config a conversion would use.

    Returns:
        True when convert would swap it.
    """
    if not isinstance(module, nn.Linear) or isinstance(module, MXLinear):
        return False
    return _not_convertible(module, config) is None


def _shown(value: object) -> str:
    """A config field's value as the config's repr shows it (an enum by its value)."""
    return repr(value.value if isinstance(value, enum.Enum) else value)


def _short_name(recipe_or_config: str | MXRecipe | MXLinearConfig, config: MXLinearConfig) -> str:
    """The recipe's name, or the nearest recipe's and the fields that differ from it."""
    if not isinstance(recipe_or_config, MXLinearConfig):
        return MXRecipe(recipe_or_config).value
    best: tuple[str, list[str]] | None = None
    for recipe in MXRecipe:
        preset = MXLinearConfig.from_recipe(recipe)
        differ = [
            f"{f.name}={_shown(getattr(config, f.name))}"
            for f in dataclasses.fields(config)
            if getattr(config, f.name) != getattr(preset, f.name)
        ]
        if best is None or len(differ) < len(best[1]):
            best = (recipe.value, differ)
    assert best is not None
    return ", ".join([best[0], *best[1]])


def convert(
    model: nn.Module,
    recipe_or_config: str | MXRecipe | MXLinearConfig = "mxfp8",
    *,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> nn.Module:
    """Replace the linear layers of ``model`` by ``MXLinear`` layers sharing their
    Parameter objects, so state_dict keys and dtypes stay the same.

    Converted: every ``nn.Linear``, a subclass too, that runs nn.Linear's own forward
    (``type(m).forward is nn.Linear.forward``, none set on the instance) and holds no
    parameters, buffers or submodules besides ``weight`` and ``bias``. A subclass
    becomes a plain MXLinear: its other attributes and methods are not carried over.
    torchtitan's ``Linear`` loses its ``_param_init``, and its ``init_states`` walk
    reaches only torchtitan's own module types: initialise the weights (``init_states``)
    before convert; converted layers keep the values they have.

    Left alone, each named with its reason in one INFO line on the ``mx_nn`` logger:
    a linear that overrides forward (``overrides forward (<class>)``; its forward may do
    more than ``x @ W^T + b``), holds more than weight and bias, has in/out features
    that are not multiples of the block size, or for which ``filter_fn(module, fqn)``
    returns False (``filter_fn``; it is asked of the MXLinear layers of another config
    too). Then one INFO line, ``mx_nn.convert: N of M linears converted to MX
    (<recipe>); K left alone``, N counting the layers that are MXLinear with this config
    afterwards (those converted before included, and said so).

    Every check runs before the first layer is swapped: a refused call leaves ``model``
    as it was and logs nothing. Every module with two or more MXLinear children then
    gets a cast scope, in which the children reading one input share its casts
    (:func:`mx_nn.share_input_casts`).

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
        ``model``, or the new module when ``model`` itself is a linear it converts.

    Raises:
        TypeError: ``model`` not an ``nn.Module``, ``recipe_or_config`` of another type,
            ``filter_fn`` not callable or returning something other than a bool.
        ValueError: an unknown recipe name; layers already MXLinear with another config
            (named, with both configs); a linear to convert whose parameters are
            DTensors (convert before tensor parallelism or FSDP2, as
            ``mx_nn.parallelize`` does) or that has forward or backward hooks, which
            the new module would not run; a ``gemm_backend`` that cannot run on the
            layers' device (``mx_nn.casts.compute_path.check_gemm_backends``).

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
    originals: dict[int, nn.Linear] = {}  # the linears made into MXLinear, by id
    conflicts: dict[MXLinearConfig, list[str]] = {}
    linears: set[int] = set()
    mx: set[int] = set()  # MXLinear with this config afterwards
    alone: list[tuple[int, str, str]] = []  # (id, fqn, why), logged once all checks pass
    for fqn, parent, name, module in _layers(model):
        if not isinstance(module, nn.Linear):
            continue
        linears.add(id(module))
        if isinstance(module, MXLinear):
            if module.config == config:
                mx.add(id(module))
            elif keep(module, fqn):
                alone.append((id(module), fqn, "filter_fn"))
            else:
                conflicts.setdefault(module.config, []).append(fqn or "<root>")
            continue
        why = _not_plain(module)
        if why is None and keep(module, fqn):
            why = "filter_fn"
        if why is None:
            why = _not_convertible(module, config)
        if why is not None:
            alone.append((id(module), fqn, why))
            continue
        if id(module) not in made:
            _check_swappable(module, fqn)
            made[id(module)] = MXLinear.from_linear(module, config, fqn=fqn or None)
            originals[id(module)] = module
        mx.add(id(module))
        swaps.append((parent, name, made[id(module)]))
    if conflicts:
        raise ValueError(_conflict_message(conflicts, config))
    for device in {linear.weight.device for linear in originals.values()}:
        check_gemm_backends(config, device, "mx_nn.convert")
    made_from = [type(m) for m in originals.values()]
    _log(alone, len(linears), mx, made_from, _short_name(recipe_or_config, config))
    for parent, name, new in swaps:
        if parent is None:
            return new
        setattr(parent, name, new)
    share_input_casts(model)
    return model


def _log(
    alone: list[tuple[int, str, str]],
    n_linears: int,
    mx: set[int],
    made_from: list[type],
    recipe: str,
) -> None:
    """The INFO lines of one conversion: each linear left alone (``alone``: id, fqn,
    reason), the subclasses made plain (``made_from``: the type of each linear swapped),
    the counts (``mx``: ids of the linears that are MXLinear with the config after it)."""
    left = {key for key, _, _ in alone if key not in mx}
    for _, fqn, why in alone:
        logger.info("mx_nn.convert: %s left alone: %s", fqn or "<root>", why)
    subclasses: dict[type, int] = {}
    for cls in made_from:
        if cls is not nn.Linear:
            subclasses[cls] = subclasses.get(cls, 0) + 1
    for cls, n in subclasses.items():
        logger.info(
            "mx_nn.convert: %d %s.%s layer(s) became plain MXLinear, without that class's other "
            "attributes and methods (initialise weights before convert)",
            n,
            cls.__module__,
            cls.__qualname__,
        )
    already = len(mx) - len(made_from)
    logger.info(
        "mx_nn.convert: %d of %d linears converted to MX (%s)%s; %d left alone%s",
        len(mx),
        n_linears,
        recipe,
        f", {already} of them before this call" if already else "",
        len(left),
        " (see above)" if left else "",
    )


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
            f"{f.name}={_shown(getattr(existing, f.name))} "
            f"(requested {_shown(getattr(config, f.name))})"
            for f in dataclasses.fields(config)
            if getattr(existing, f.name) != getattr(config, f.name)
        ]
        groups.append(f"{shown}{more} have {existing!r}, differing in {', '.join(differ)}")
    return (
        f"convert: {n} layer(s) are already MXLinear with another config than the requested "
        f"{config!r}: {'; '.join(groups)}. convert does not re-configure layers; convert a "
        f"fresh model, or leave these layers out with filter_fn"
    )
