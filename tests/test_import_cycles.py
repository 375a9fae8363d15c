"""No import circles inside a package, and mx-kernels' three layers: read from the
sources with ``ast`` (nothing is imported), so a circle is found even where the import
order of the day happens to work."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# mx_nn joins once its own circle is gone.
PACKAGES = ("mx_core", "mx_kernels", "mx_dtensor", "mx_nn")

# mx-kernels, top to bottom (packages/mx-kernels/README.md, "Layout"): each module
# imports only modules of its own layer or of the layers below it.
KERNEL_LAYERS = {
    "ops": {
        "__init__", "cast", "fake_quant", "inline_casts", "cast_plan", "dequant", "matmul",
        "matmul_args", "cublas", "swizzle", "testing", "norm_cast", "swiglu_cast",
    },
    "kernels": {
        "cast_triton", "cast_launch", "dequant_triton", "matmul_triton", "bf16_mm",
        "fused_cast_triton", "norm_cast_triton", "swiglu_cast_triton",
    },
    "runtime": {"settings", "backend", "capability", "launch", "library"},
}  # fmt: skip
LAYER_ORDER = ("ops", "kernels", "runtime")


def _source_root(package: str) -> pathlib.Path:
    return ROOT / "packages" / package.replace("_", "-") / "src" / package


def _modules(package: str) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, packages as ``pkg.sub.__init__``."""
    src = _source_root(package)
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict) -> str | None:
    """The module a dotted name imports: a module file, a package's ``__init__``, or
    None outside the package."""
    if name in modules:
        return name
    if f"{name}.__init__" in modules:
        return f"{name}.__init__"
    return None


def _imports(module: str, path: pathlib.Path, modules: dict) -> set[str]:
    """The package's modules that ``module`` imports, at module level or inside
    functions (``ast.walk`` visits both)."""
    package_parts = module.split(".")[:-1]  # the package the file is in
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(_resolve(alias.name, modules))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the file's package, one level up per extra dot
                base = package_parts[: len(package_parts) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module
            target = _resolve(source, modules)
            for alias in node.names:
                # `from pkg import mod` imports pkg.mod; `from pkg import name`, pkg itself
                sub = _resolve(f"{source}.{alias.name}", modules)
                found.add(sub if sub is not None else target)
    found.discard(None)
    found.discard(module)
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = _modules(package)
    return {m: _imports(m, path, modules) for m, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    done, on_path, path = set(), set(), []

    def visit(node: str) -> list[str] | None:
        on_path.add(node)
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        on_path.discard(node)
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    graph = import_graph(package)
    assert graph, f"no modules found for {package}"
    cycle = find_cycle(graph)
    assert cycle is None, f"{package} has an import cycle: {' -> '.join(cycle)}"


def _layer_of() -> dict[str, str]:
    return {f"mx_kernels.{m}": layer for layer, members in KERNEL_LAYERS.items() for m in members}


def test_every_mx_kernels_module_has_a_layer():
    layer_of = _layer_of()
    modules = set(_modules("mx_kernels"))
    assert modules - set(layer_of) == set(), "place new modules in KERNEL_LAYERS"
    assert set(layer_of) - modules == set(), "KERNEL_LAYERS names modules that are gone"


def test_mx_kernels_imports_only_downward():
    """Op modules import kernels and the runtime; kernels and their launchers import
    kernels and the runtime, never an op module; the runtime imports only itself."""
    layer_of = _layer_of()
    rank = {layer: i for i, layer in enumerate(LAYER_ORDER)}
    wrong = [
        f"{m} ({layer_of[m]}) imports {dep} ({layer_of[dep]})"
        for m, deps in sorted(import_graph("mx_kernels").items())
        for dep in sorted(deps)
        if rank[layer_of[dep]] < rank[layer_of[m]]
    ]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)
    triton_files = {m for m in layer_of if m.endswith("_triton")}
    assert triton_files, "no *_triton module found"
    misplaced = {m for m in triton_files if layer_of[m] != "kernels"}
    assert not misplaced, f"*_triton modules outside the kernel layer: {sorted(misplaced)}"
