"""How mx-kernels' modules use each other: only public names across files, and an import
of the package that registers its ops and does nothing else. The layers and the absence
of import circles are checked at the repository root (tests/test_import_cycles.py)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import mx_kernels

SRC = pathlib.Path(mx_kernels.__file__).parent
MODULES = {p.stem: p for p in sorted(SRC.glob("*.py")) if p.stem != "__init__"}


def _all_of(path: pathlib.Path) -> set[str]:
    """The names in a module's ``__all__``, read from its source."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def _uses(path: pathlib.Path):
    """(line, module, name) for each name this file takes from another mx_kernels module:
    ``from mx_kernels.mod import name`` and ``mod.name`` on a module it imported."""
    tree = ast.parse(path.read_text())
    modules_bound = {}  # local name -> mx_kernels module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "mx_kernels":
            for alias in node.names:
                if alias.name in MODULES:
                    modules_bound[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mx_kernels."):
            module = node.module.split(".", 1)[1]
            for alias in node.names:
                yield node.lineno, module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mx_kernels.") and alias.asname:
                    modules_bound[alias.asname] = alias.name.split(".", 1)[1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = modules_bound.get(node.value.id)
            if module is not None:
                yield node.lineno, module, node.attr


def test_modules_take_only_public_names_from_each_other():
    """What one module needs of another is public there: no leading underscore, and in
    that module's ``__all__``."""
    exported = {m: _all_of(p) for m, p in MODULES.items()}
    wrong = []
    for path in [*MODULES.values(), SRC / "__init__.py"]:
        for line, module, name in _uses(path):
            if module == path.stem or name.startswith("__"):
                continue
            if name.startswith("_") or name not in exported[module]:
                wrong.append(f"{path.name}:{line} takes {module}.{name}")
    assert not wrong, "names not public in their module:\n" + "\n".join(wrong)


def test_import_registers_the_ops_and_does_nothing_else():
    """No GPU query, no environment read and no triton import while ``mx_kernels`` is
    imported (every switch is read when it matters: mx_kernels.settings)."""
    code = """
import os, sys
import torch, mx_core

assert "triton" not in sys.modules
reads = []


class Recording(dict):
    def get(self, key, default=None):
        reads.append(key)
        return super().get(key, default)

    def __getitem__(self, key):
        reads.append(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        reads.append(key)
        return super().__contains__(key)


os.environ._data = Recording(os.environ._data)
queries = []
for name in ("is_available", "device_count", "get_device_properties",
             "get_device_capability", "current_device", "init"):
    setattr(torch.cuda, name, lambda *a, _name=name, **k: queries.append(_name))
import mx_kernels

assert not reads, f"environment read at import: {reads}"
assert not queries and not torch.cuda.is_initialized(), f"GPU queried at import: {queries}"
triton = sorted(m for m in sys.modules if m == "triton" or m.endswith("_triton"))
assert not triton, f"imported at import: {triton}"
for op in ("quantize_rowwise", "quantize_colwise", "quantize_both", "dequantize_rowwise",
           "fake_quantize_rowwise", "fake_quantize_colwise", "fake_quantize_both",
           "scaled_mm"):
    assert hasattr(torch.ops.mx, op), op
"""
    subprocess.run([sys.executable, "-c", code], check=True)
