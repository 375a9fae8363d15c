"""mx-nn: ``MXLinear``, configs and recipes, model conversion and parallelization.

``convert(model, "mxfp8")`` swaps ``nn.Linear`` layers for :class:`MXLinear`, whose
three GEMMs run in MX (the GEMM table is in :mod:`mx_nn.config`).
``parallelize(model, mesh)`` converts a decoder model and applies tensor, sequence and
FSDP2 parallelism (:mod:`mx_nn.parallelize`): its checks, then ``convert``,
``apply_tp``, ``apply_compile`` and ``apply_fsdp``, each public for trainers that run
them one by one (the plan in :mod:`mx_nn.plan`).

Subpackages: :mod:`mx_nn.casts` (where MXLinear gets its casts), :mod:`mx_nn.dtensor`
(MXLinear on DTensors), :mod:`mx_nn.fsdp` (FSDP2 gathers in MX), :mod:`mx_nn.plan`
(the TP plan and the checks before it), :mod:`mx_nn.models` (the Llama that ``mx-train``
trains) and :mod:`mx_nn.train` (the ``mx-train`` command).
"""

import importlib

from mx_nn import _deprecated
from mx_nn.casts.scopes import keep_weight_casts, shared_casts
from mx_nn.config import MXLinearConfig, MXRecipe
from mx_nn.convert import convert
from mx_nn.export.api import export as export_model
from mx_nn.fsdp.enable import enable_fsdp_mx_all_gather
from mx_nn.linear import MXLinear, share_input_casts
from mx_nn.parallelize import parallelize
from mx_nn.plan.apply import apply_compile, apply_fsdp, apply_tp

__version__ = "0.1.0"

__all__ = ["MXLinear", "MXLinearConfig", "MXRecipe", "convert"]
__all__ += ["apply_compile", "apply_fsdp", "apply_tp", "enable_fsdp_mx_all_gather", "parallelize"]
__all__ += ["keep_weight_casts", "share_input_casts", "shared_casts"]
__all__ += ["export_model"]

_deprecated.install()

# Names mx_nn exported before the models moved to mx_nn.models.
_MOVED_NAMES = {n: "mx_nn.models" for n in ("Attention", "FeedForward", "Llama", "LlamaConfig",
                                            "TransformerBlock")}  # fmt: skip


_SUBPACKAGES = ("casts", "dtensor", "fsdp", "models", "plan", "train")


def __getattr__(name: str):
    if name in _MOVED_NAMES:
        _deprecated.warn_moved(f"mx_nn.{name}", f"{_MOVED_NAMES[name]}.{name}")
        return getattr(importlib.import_module(_MOVED_NAMES[name]), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"mx_nn.{name}")
    old = f"mx_nn.{name}"
    if old in _deprecated.MOVED:
        return importlib.import_module(old)  # warns through the alias finder
    raise AttributeError(f"module 'mx_nn' has no attribute {name!r}")
