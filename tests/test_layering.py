"""Conventions across packages: imports flow down, importing has no side effects, the
public API is documented, README examples run."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ORDER = ["mx_core", "mx_kernels", "mx_dtensor", "mx_nn"]
PACKAGE_DIRS = {m: ROOT / "packages" / m.replace("_", "-") for m in ORDER}
# Third-party imports each package may use at module level (torch everywhere). Test-only
# helpers (mx_core.testing, mx_core.oracle) import numpy and ml_dtypes inside functions.
THIRD_PARTY = {"mx_core": set(), "mx_kernels": {"triton"}, "mx_dtensor": set(), "mx_nn": set()}


def _top_level_imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", ORDER)
def test_imports_flow_down(module):
    allowed = set(ORDER[: ORDER.index(module) + 1]) | THIRD_PARTY[module] | {"torch"}
    for path in (PACKAGE_DIRS[module] / "src" / module).rglob("*.py"):
        third = {n for n in _top_level_imports(path) if n not in sys.stdlib_module_names}
        if path.name in ("testing.py", "oracle.py"):
            third -= {"numpy", "ml_dtypes"}
        if path.relative_to(PACKAGE_DIRS[module]).as_posix() == "src/mx_nn/train/extras.py":
            third -= {"tqdm", "matplotlib"}  # the mx-nn[train] extra, imported on first use
        if path.relative_to(PACKAGE_DIRS[module]).as_posix() == "src/mx_nn/plan/torchtitan.py":
            third -= {"torchtitan"}  # the torchtitan converter, imported only by name
        assert third <= allowed, f"{path.relative_to(ROOT)} imports {sorted(third - allowed)}"


def test_importing_touches_no_gpu():
    code = (
        "import torch, mx_core, mx_kernels, mx_dtensor, mx_nn\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialized at import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("module", ORDER)
def test_public_api_is_listed_and_documented(module):
    mod = __import__(module)
    assert mod.__doc__
    for name in mod.__all__:
        obj = getattr(mod, name)
        if callable(obj) and not name.isupper():
            assert obj.__doc__, f"{module}.{name} has no docstring"


def _python_blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


READMES = [ROOT / "README.md", *sorted((ROOT / "packages").glob("*/README.md"))]


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_readme_examples_run(readme):
    for block in _python_blocks(readme):
        exec(compile(block, str(readme), "exec"), {})


def test_readme_opens_with_the_two_commands_ci_uses():
    text = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert "tools/setup.sh" in commands[0]
    assert commands[1].strip().splitlines()[-1] == "bash tools/test-all.sh"
    assert "bash tools/test-all.sh" in (ROOT / ".ci" / "run").read_text()


def test_numerics_report_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools/numerics_report.py"), "--rows", "32", "--cols", "256"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "semantics table: 368/368 cases as specified" in out


BENCHMARKS = ["casts.py", "gemm.py", "linear.py", "tp_layer.py", "host_cost.py",
              "dtensor_overhead.py", "parallelize_overhead.py", "multi_gpu.py",
              "fused.py"]  # fmt: skip
DIAGNOSTICS = ["diagnose_casts.py", "profile_casts.py", "repro_both_fp4.py"]


def test_host_cost_runs_on_cpu_with_the_launch_stubbed():
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools/bench/host_cost.py"), "--cpu-stub", "--calls", "20"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "| quantize_both |" in out and "kernel launch stubbed" in out


def test_benchmark_scripts_are_the_listed_ones():
    on_disk = {p.name for p in (ROOT / "tools/bench").glob("*.py")} - {"common.py"}
    assert on_disk == set(BENCHMARKS)
    assert {p.name for p in (ROOT / "tools/bench/diagnostics").glob("*.py")} == set(DIAGNOSTICS)


def test_host_cost_step_runs_on_cpu_with_the_launch_stubbed():
    script = str(ROOT / "tools/bench/host_cost.py")
    out = subprocess.run(
        [sys.executable, script, "--step", "--modes=eager", "--steps=3"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.startswith("eager: bf16 ") and " MX " in out


@pytest.mark.parametrize("script", BENCHMARKS)
def test_benchmarks_import_and_parse_arguments(script):
    # They only run on a GPU; this catches a broken import or argument parser here.
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools/bench" / script), "--help"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "--quick" in out


@pytest.mark.parametrize("script", DIAGNOSTICS)
def test_diagnostics_import_and_parse_arguments(script):
    subprocess.run(
        [sys.executable, str(ROOT / "tools/bench/diagnostics" / script), "--help"],
        check=True,
        capture_output=True,
    )
