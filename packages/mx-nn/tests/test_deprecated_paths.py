"""mx-nn's module paths before its subpackages: each old path still imports, with one
FutureWarning naming the new path, and gives the new module object; the names mx_nn
exported before the models moved warn and give the new objects. The imports run in fresh
processes, where nothing has been imported yet (an import warns only the first time)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import mx_nn
from mx_nn import _deprecated


def _run(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter (``sys.argv[1:]`` is ``args``) and return the
    JSON object it prints last."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


_IMPORT_OLD = """
import importlib, json, sys, warnings

import mx_nn

old, new = sys.argv[1:]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exec(f"import {old}")
module = sys.modules[old]
print(json.dumps({
    "future": [str(w.message) for w in caught if issubclass(w.category, FutureWarning)],
    "same": module is importlib.import_module(new) and module is sys.modules[new],
    "name": module.__name__,
    "attribute": getattr(mx_nn, old.rpartition(".")[2]) is module,
}))
"""


@pytest.mark.parametrize("old, new", sorted(_deprecated.MOVED.items()))
def test_old_module_path_warns_once_and_is_the_new_module(old, new):
    out = _run(_IMPORT_OLD, old, new)
    assert len(out["future"]) == 1, out["future"]
    assert out["future"][0].startswith(f"{old} moved to {new};")
    assert out["same"] and out["name"] == new and out["attribute"]


_ATTRIBUTE_OLD = """
import importlib, json, sys, warnings

import mx_nn
from mx_nn._deprecated import MOVED

out = {}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = getattr(mx_nn, old.rpartition(".")[2])
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    out[old] = [future, module is importlib.import_module(new)]
print(json.dumps(out))
"""


def test_old_module_paths_as_attributes_warn_once_and_are_the_new_modules():
    out = _run(_ATTRIBUTE_OLD)
    assert sorted(out) == sorted(_deprecated.MOVED)
    for old, (future, same) in out.items():
        new = _deprecated.MOVED[old]
        assert len(future) == 1 and future[0].startswith(f"{old} moved to {new};"), future
        assert same, old


_FROM_LLAMA = """
import json, warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from mx_nn.llama import Llama
import mx_nn.models

print(json.dumps({
    "future": [str(w.message) for w in caught if issubclass(w.category, FutureWarning)],
    "same": Llama is mx_nn.models.Llama,
}))
"""


def test_from_old_llama_import_llama():
    out = _run(_FROM_LLAMA)
    assert out["same"]
    assert out["future"] == [
        "mx_nn.llama moved to mx_nn.models.llama; the old path goes away in the next release"
    ]


@pytest.mark.parametrize("name", sorted(mx_nn._MOVED_NAMES))
def test_old_top_level_model_names_warn_and_are_the_new_objects(name):
    import mx_nn.models

    with pytest.warns(FutureWarning, match=rf"^mx_nn\.{name} moved to mx_nn\.models\.{name};"):
        obj = getattr(mx_nn, name)
    assert obj is getattr(mx_nn.models, name)
    assert name not in mx_nn.__all__


SUBPACKAGES = ("casts", "dtensor", "fsdp", "models", "plan", "train")

_SUBPACKAGES = """
import importlib, json, sys, warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import mx_nn
    same = {n: getattr(mx_nn, n) is importlib.import_module(f"mx_nn.{n}") for n in sys.argv[1:]}
print(json.dumps({
    "future": [str(w.message) for w in caught if issubclass(w.category, FutureWarning)],
    "same": same,
}))
"""


def test_subpackages_are_attributes_without_warnings():
    out = _run(_SUBPACKAGES, *SUBPACKAGES)
    assert out["future"] == []
    assert out["same"] == dict.fromkeys(SUBPACKAGES, True)


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match=r"^module 'mx_nn' has no attribute 'nothing'$"):
        mx_nn.nothing  # noqa: B018


_NO_GATHER_HOOK = """
import importlib, json, sys

import mx_nn
for name in sys.argv[1:]:
    importlib.import_module(f"mx_nn.{name}")
from mx_dtensor import gather

print(json.dumps({"hooks": len(gather._HOOKS)}))
"""


def test_importing_mx_nn_registers_no_gather_hook():
    # parallelize registers the handover when it installs an MX gather, not the import.
    assert _run(_NO_GATHER_HOOK, *SUBPACKAGES) == {"hooks": 0}
