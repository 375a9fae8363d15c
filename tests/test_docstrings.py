"""Public functions say their arguments, results and errors (Google style).

Public: the names in the ``__all__`` of each package, of mx_nn's subpackages ``plan``,
``casts``, ``fsdp`` and ``dtensor``, and of every module in :data:`CHECKED`, each
checked in the module that defines it. Every public class and function has a docstring.
A public function with parameters has an ``Args:`` (or ``Keyword Args:``) section, or
says "Arguments as :func:`other`" where another function documents the same arguments;
one whose own body returns a value (``return x``, not ``return None``; nested functions
do not count) has ``Returns:``; one whose own body raises has ``Raises:`` (``Raises
(at ...):`` too). A generator or context manager returns nothing to document. A Triton
kernel needs a docstring only: its parameters are its launcher's.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap

import pytest

PACKAGES = ("mx_core", "mx_kernels", "mx_dtensor", "mx_nn")
SUBPACKAGES = ("mx_nn.plan", "mx_nn.casts", "mx_nn.fsdp", "mx_nn.dtensor")
# The modules whose public functions and classes are checked.
CHECKED = (
    "mx_core", "mx_core.args", "mx_core.cast_settings", "mx_core.choices",
    "mx_core.elements", "mx_core.formats", "mx_core.oracle", "mx_core.packing",
    "mx_core.quantize",
    "mx_core.scale", "mx_core.tensor", "mx_core.testing",
    "mx_kernels", "mx_kernels.backend", "mx_kernels.bf16_mm", "mx_kernels.capability",
    "mx_kernels.cast", "mx_kernels.cast_launch", "mx_kernels.cast_plan",
    "mx_kernels.cast_triton", "mx_kernels.cublas", "mx_kernels.dequant",
    "mx_kernels.dequant_triton", "mx_kernels.fake_quant", "mx_kernels.fused_cast_triton",
    "mx_kernels.inline_casts", "mx_kernels.launch", "mx_kernels.library", "mx_kernels.matmul",
    "mx_kernels.matmul_args", "mx_kernels.matmul_triton", "mx_kernels.norm_cast",
    "mx_kernels.norm_cast_triton", "mx_kernels.settings", "mx_kernels.swiglu_cast",
    "mx_kernels.swiglu_cast_triton", "mx_kernels.swizzle", "mx_kernels.testing",
    "mx_dtensor", "mx_dtensor.cast_args", "mx_dtensor.fused_rules", "mx_dtensor.gather",
    "mx_dtensor.shard_checks",
    "mx_dtensor.sharding", "mx_dtensor.styles",
    "mx_dtensor.styles.common", "mx_dtensor.styles.linear",
    "mx_dtensor.styles.prepare_input", "mx_dtensor.styles.sequence", "mx_dtensor.testing",
    "mx_nn", "mx_nn.config", "mx_nn.linear", "mx_nn.linear_gemms", "mx_nn.models",
    "mx_nn.models.llama",
    "mx_nn.casts", "mx_nn.casts.compute_path", "mx_nn.casts.fused", "mx_nn.casts.gathered",
    "mx_nn.casts.layer", "mx_nn.casts.scopes", "mx_nn.dtensor", "mx_nn.dtensor.local_shards",
    "mx_nn.dtensor.placements", "mx_nn.fsdp", "mx_nn.fsdp.check", "mx_nn.fsdp.enable",
    "mx_nn.fsdp.gathered", "mx_nn.fsdp.weight", "mx_nn.convert", "mx_nn.parallelize",
    "mx_nn.export", "mx_nn.export.api", "mx_nn.export.from_dcp", "mx_nn.export.hf_dir",
    "mx_nn.export.llama_names", "mx_nn.export.load", "mx_nn.export.plan",
    "mx_nn.export.safetensors_io", "mx_nn.export.schemes", "mx_nn.export.stream",
    "mx_nn.export.weights", "mx_nn.plan.apply", "mx_nn.plan.checks", "mx_nn.plan.families",
    "mx_nn.plan.fused", "mx_nn.plan.llama", "mx_nn.plan.norms", "mx_nn.plan.resolve",
    "mx_nn.plan.titan", "mx_nn.plan.torchtitan", "mx_nn.train", "mx_nn.train.args",
    "mx_nn.train.budget", "mx_nn.train.checkpoint", "mx_nn.train.cli", "mx_nn.train.data",
    "mx_nn.train.distributed", "mx_nn.train.export", "mx_nn.train.extras",
    "mx_nn.train.guard", "mx_nn.train.loop", "mx_nn.train.manifest", "mx_nn.train.progress",
    "mx_nn.train.report", "mx_nn.train.sample", "mx_nn.train.stop",
)  # fmt: skip
DELEGATED = re.compile(r"Arguments as :(func|meth|class):`")


def _public() -> dict[str, dict[str, object]]:
    """Defining module -> {name: object} of every public name (module doc)."""
    by_module: dict[str, dict[str, object]] = {}
    for name in (*PACKAGES, *SUBPACKAGES, *CHECKED):
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            target = getattr(obj, "fn", obj)  # a Triton kernel's Python function
            if inspect.isclass(obj) or inspect.isfunction(inspect.unwrap(target)):
                by_module.setdefault(target.__module__, {})[attr] = obj
    return by_module


def _own_nodes(fn: ast.AST):
    """The nodes of ``fn``'s body outside nested functions, lambdas and classes."""
    stack = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _missing(obj) -> list[str]:
    """What the docstring of ``obj`` lacks (module doc)."""
    if inspect.isclass(obj):
        doc = obj.__doc__ or ""
        # dataclasses and NamedTuples write "Name(field, ...)" where the class has none
        return [] if doc.strip() and not doc.startswith(f"{obj.__name__}(") else ["docstring"]
    kernel = hasattr(obj, "fn") and not inspect.isfunction(obj)
    fn = inspect.unwrap(obj.fn if kernel else obj)
    doc = fn.__doc__ or ""
    if not doc.strip():
        return ["docstring"]
    if kernel:
        return []
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    nodes = list(_own_nodes(tree))
    missing = []
    params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]
    if params and not ("Args:" in doc or DELEGATED.search(doc)):
        missing.append("Args:")
    generator = any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in nodes)
    returns = any(
        isinstance(n, ast.Return)
        and n.value is not None
        and not (isinstance(n.value, ast.Constant) and n.value.value is None)
        for n in nodes
    )
    if returns and not generator and "Returns:" not in doc:
        missing.append("Returns:")
    raises = any(isinstance(n, ast.Raise) and n.exc is not None for n in nodes)
    if raises and not re.search(r"^\s*Raises( \(.*\))?:", doc, re.M):
        missing.append("Raises:")
    return missing


def test_the_checked_modules_are_public_modules():
    for name in CHECKED:
        assert not any(part.startswith("_") for part in name.split(".")), name
        importlib.import_module(name)


@pytest.mark.parametrize("module", CHECKED)
def test_public_functions_document_args_returns_and_raises(module):
    objects = _public().get(module, {})
    gaps = {name: m for name, obj in sorted(objects.items()) if (m := _missing(obj))}
    assert not gaps, f"{module}: docstrings lack {gaps}"


def test_the_rule_itself():
    def documented(a, b=1):
        """Sum.

        Args:
            a, b: numbers.

        Returns:
            a + b.

        Raises:
            ValueError: a negative.
        """
        if a < 0:
            raise ValueError(a)
        return a + b

    def delegated(a):
        """As documented. Arguments as :func:`documented`."""

    def bare(a):
        """No sections."""
        if a:
            raise TypeError(a)
        return a

    def nested():
        """Nothing of its own to return or raise."""

        def inner():
            raise ValueError

        return None

    assert _missing(documented) == [] and _missing(delegated) == [] and _missing(nested) == []
    assert _missing(bare) == ["Args:", "Returns:", "Raises:"]
