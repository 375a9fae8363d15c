"""Module paths of mx-nn before its subpackages, kept importable for one release.

``import mx_nn.tp_plan`` (and the others below) still works, with a FutureWarning
naming the new path; the module object is the new one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "mx_nn.cast_cache": "mx_nn.casts.scopes",
    "mx_nn.compute_path": "mx_nn.casts.compute_path",
    "mx_nn.fused_casts": "mx_nn.casts.fused",
    "mx_nn.layer_casts": "mx_nn.casts.layer",
    "mx_nn.gathered_cast": "mx_nn.casts.gathered",
    "mx_nn.placements": "mx_nn.dtensor.placements",
    "mx_nn.local_shards": "mx_nn.dtensor.local_shards",
    "mx_nn.fsdp_check": "mx_nn.fsdp.check",
    "mx_nn.fsdp_gathered": "mx_nn.fsdp.gathered",
    "mx_nn.fsdp_weight": "mx_nn.fsdp.weight",
    "mx_nn.parallelize_check": "mx_nn.plan.checks",
    "mx_nn.tp_plan": "mx_nn.plan.families",
    "mx_nn.llama": "mx_nn.models.llama",
}
"""Old module path -> new module path."""


def warn_moved(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path goes away in the next release",
        FutureWarning,
        stacklevel=3,
    )


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        warn_moved(spec.name, MOVED[spec.name])
        # The import system keeps the new module's own __name__ and __spec__ (it only
        # fills attributes that are missing) and binds it under the old name too.
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Make the old paths importable (idempotent)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
