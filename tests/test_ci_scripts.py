"""tools/ci_packages.py (which jobs a change runs; ci.yml lists every package) and
tools/check_versions.py (a code change needs a changelog entry)."""

import importlib.util
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ci = _load("ci_packages")
versions = _load("check_versions")
ORDER = ["mx-core", "mx-kernels", "mx-dtensor", "mx-nn"]


def test_dependency_graph_from_the_pyprojects():
    deps = ci.sibling_deps()
    assert ci.install_order(deps) == ORDER
    assert ci.siblings("mx-nn", deps) == ORDER[:3]
    assert ci.siblings("mx-core", deps) == []


def test_a_change_runs_its_package_and_those_above_it():
    deps = ci.sibling_deps()
    assert ci.affected(["packages/mx-kernels/src/mx_kernels/cast.py"], deps) == set(ORDER[1:])
    assert ci.affected(["packages/mx-nn/README.md"], deps) == {"mx-nn"}
    assert ci.affected(["packages/mx-core/tests/test_scale.py"], deps) == set(ORDER)
    docs_and_tools = ["BENCHMARKS.md", "tests/test_layering.py", "tools/bench/casts.py"]
    assert ci.affected(docs_and_tools, deps) == set()
    assert ci.affected(["constraints/cpu.txt"], deps) == set(ORDER)
    assert ci.affected([".github/workflows/package.yml"], deps) == set(ORDER)
    with pytest.raises(ValueError, match="cycle"):
        ci.install_order({"a": ["b"], "b": ["a"]})


def _copy_layout(tmp_path, ci_yml: str) -> pathlib.Path:
    for path in (ROOT / "packages").glob("*/pyproject.toml"):
        dest = tmp_path / path.relative_to(ROOT)
        dest.parent.mkdir(parents=True)
        shutil.copy(path, dest)
    workflow = tmp_path / ci.CI_WORKFLOW
    workflow.parent.mkdir(parents=True)
    workflow.write_text(ci_yml)
    return tmp_path


def test_the_ci_matrix_lists_exactly_the_packages(tmp_path):
    assert ci.check_matrix() == []
    text = (ROOT / ci.CI_WORKFLOW).read_text()
    dropped = text.replace("package: mx-dtensor", "package: mx-extra")
    problems = ci.check_matrix(_copy_layout(tmp_path / "a", dropped))
    assert any("no job runs package mx-dtensor" in p for p in problems)
    assert any("'mx-extra', which is not under packages/" in p for p in problems)
    wrong = text.replace("siblings: mx-core mx-kernels mx-dtensor", "siblings: mx-core")
    wrong = wrong.replace("if: needs.changes.outputs.mx-core == 'true'", "if: true")
    problems = ci.check_matrix(_copy_layout(tmp_path / "b", wrong))
    assert len(problems) == 2
    assert "installs siblings 'mx-core'; mx-nn declares" in problems[0] + problems[1]
    assert "mx-core' must run only if" in problems[0] + problems[1]


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    for var in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{var}_NAME", "ci test")
        monkeypatch.setenv(f"GIT_{var}_EMAIL", "ci@example.invalid")
    pkg = tmp_path / "packages" / "mx-a"
    (pkg / "src" / "mx_a").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text('[project]\nname = "mx-a"\n')
    (pkg / "src" / "mx_a" / "__init__.py").write_text('__version__ = "0.1.0"\n')
    (pkg / "CHANGELOG.md").write_text("# Changelog\n\n## Unreleased\n\n## 0.1.0\n\n- First.\n")
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "base")
    _git(tmp_path, "checkout", "-q", "-b", "work")
    return tmp_path


def _commit(repo, path, text):
    (repo / path).write_text(text)
    _git(repo, "commit", "-q", "-am", f"edit {path}")


def test_code_change_without_changelog_entry_is_flagged(repo):
    assert versions.check("main", repo) == []  # nothing changed
    _commit(repo, "packages/mx-a/src/mx_a/__init__.py", '__version__ = "0.1.0"\nX = 1\n')
    (problem,) = versions.check("main", repo)
    assert problem.startswith("mx-a: 1 file(s) under packages/mx-a/src changed since main")
    _commit(
        repo,
        "packages/mx-a/CHANGELOG.md",
        "# Changelog\n\n## Unreleased\n\n- Add X.\n\n## 0.1.0\n\n- First.\n",
    )
    assert versions.check("main", repo) == []


def test_a_version_bump_needs_its_heading_and_must_grow(repo):
    init = "packages/mx-a/src/mx_a/__init__.py"
    _commit(repo, init, '__version__ = "0.2.0"\n')
    assert versions.check("main", repo) == [
        "mx-a: 1 file(s) under packages/mx-a/src changed since main "
        "(e.g. packages/mx-a/src/mx_a/__init__.py) but packages/mx-a/CHANGELOG.md has no "
        "new '- ' entry",
        "mx-a: version 0.2.0 has no '## 0.2.0' heading in packages/mx-a/CHANGELOG.md",
    ]
    _commit(
        repo,
        "packages/mx-a/CHANGELOG.md",
        "# Changelog\n\n## 0.2.0\n\n- Two.\n\n## 0.1.0\n\n- First.\n",
    )
    assert versions.check("main", repo) == []
    _commit(repo, init, '__version__ = "0.0.9"\n')
    assert "mx-a: __version__ went 0.1.0 -> 0.0.9" in versions.check("main", repo)
    with pytest.raises(ValueError, match="--base 'nope': no merge base"):
        versions.check("nope", repo)
