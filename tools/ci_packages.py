"""The workspace's packages as CI sees them: which jobs a change needs, and whether the
workflows still list exactly the packages under ``packages/``.

The dependency graph comes from each ``packages/<name>/pyproject.toml`` (the siblings
named in ``[project] dependencies``), so nothing here repeats the order
mx-core <- mx-kernels <- mx-dtensor <- mx-nn.

    python tools/ci_packages.py affected [--base REF]   # name=true|false lines
    python tools/ci_packages.py check-matrix            # exit 1 on a mismatch

``affected`` prints one ``<package>=true|false`` line per package (the format of
``$GITHUB_OUTPUT``): a package runs when a file under its folder changed since the merge
base of REF and HEAD, when one of its siblings below it did, or when a file every job
depends on did (``SHARED``). Without a usable REF (none given, all zeros as on a new
branch's first push, or unknown) every package runs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the backport pytest depends on there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CI_WORKFLOW = ".github/workflows/ci.yml"
PACKAGE_WORKFLOW = "./.github/workflows/package.yml"
# A change to any of these runs every package's job: they shape every job's install.
SHARED = (
    "constraints/",
    "pyproject.toml",
    ".github/workflows/ci.yml",
    ".github/workflows/package.yml",
    "tools/ci_packages.py",
)


def sibling_deps(root: Path = ROOT) -> dict[str, list[str]]:
    """Each package folder name -> the sibling packages it declares, direct ones only."""
    pyprojects = sorted((root / "packages").glob("*/pyproject.toml"))
    names = {p.parent.name for p in pyprojects}
    deps = {}
    for path in pyprojects:
        project = tomllib.loads(path.read_text())["project"]
        if project["name"] != path.parent.name:
            raise ValueError(
                f"{path.relative_to(root)}: project name {project['name']!r} differs from "
                f"its folder {path.parent.name!r}"
            )
        declared = (re.match(r"[A-Za-z0-9._-]+", d).group(0) for d in project["dependencies"])
        deps[path.parent.name] = sorted(n for n in declared if n in names)
    return deps


def install_order(deps: dict[str, list[str]]) -> list[str]:
    """Packages ordered so each comes after every sibling it depends on."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise ValueError(f"dependency cycle: {' -> '.join((*path, name))}")
        if name not in order:
            for dep in deps[name]:
                visit(dep, (*path, name))
            order.append(name)

    for name in sorted(deps):
        visit(name, ())
    return order


def siblings(package: str, deps: dict[str, list[str]]) -> list[str]:
    """Every sibling ``package`` needs installed (transitively), in install order."""
    needed: set[str] = set()
    todo = list(deps[package])
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo.extend(deps[name])
    return [n for n in install_order(deps) if n in needed]


def affected(changed: list[str], deps: dict[str, list[str]]) -> set[str]:
    """Packages whose tests a change to the files ``changed`` (repo-relative) can break."""
    if any(f == s or (s.endswith("/") and f.startswith(s)) for f in changed for s in SHARED):
        return set(deps)
    touched = {f.split("/")[1] for f in changed if f.startswith("packages/") and f.count("/") > 1}
    return {p for p in deps if p in touched or touched & set(siblings(p, deps))}


def changed_files(base: str | None, root: Path = ROOT) -> list[str] | None:
    """Files changed between the merge base of ``base`` and HEAD; None if base is unusable."""
    if not base or set(base) == {"0"}:
        return None
    git = ["git", "-C", str(root)]
    mb = subprocess.run([*git, "merge-base", base, "HEAD"], capture_output=True, text=True)
    if mb.returncode != 0:
        return None
    out = subprocess.run(
        [*git, "diff", "--name-only", mb.stdout.strip(), "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.splitlines()


def _workflow_jobs(text: str) -> dict[str, dict[str, str]]:
    """The scalar keys of each job in a workflow (``with:`` entries as ``with.<key>``).

    Reads the block layout the workflows use (two-space indents, ``jobs:`` at the top
    level); actionlint checks the YAML itself.
    """
    jobs: dict[str, dict[str, str]] = {}
    job = None
    section = None
    in_jobs = False
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            in_jobs = line.rstrip() == "jobs:"
            continue
        if not in_jobs:
            continue
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if len(value) > 1 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        if indent == 2:
            job, section = key, None
            jobs[job] = {}
        elif indent == 4 and job:
            section = key
            jobs[job][key] = value
        elif indent == 6 and job and section in ("with", "outputs"):
            jobs[job][f"{section}.{key}"] = value
    return jobs


def check_matrix(root: Path = ROOT) -> list[str]:
    """Mismatches between ci.yml's package jobs and the packages under ``packages/``."""
    deps = sibling_deps(root)
    jobs = _workflow_jobs((root / CI_WORKFLOW).read_text())
    calls = {n: j for n, j in jobs.items() if j.get("uses") == PACKAGE_WORKFLOW}
    problems = []
    listed = {j.get("with.package", "") for j in calls.values()}
    for name in sorted(set(deps) - listed):
        problems.append(f"{CI_WORKFLOW}: no job runs package {name} (packages/{name})")
    for name in sorted(listed - set(deps)):
        problems.append(f"{CI_WORKFLOW}: a job runs {name!r}, which is not under packages/")
    changes = jobs.get("changes", {})
    for job_name, job in sorted(calls.items()):
        pkg = job.get("with.package", "")
        if pkg not in deps:
            continue
        if job_name != pkg:
            problems.append(f"{CI_WORKFLOW}: job {job_name!r} runs {pkg}; name it {pkg!r}")
        want = " ".join(siblings(pkg, deps))
        if job.get("with.siblings", "") != want:
            problems.append(
                f"{CI_WORKFLOW}: job {job_name!r} installs siblings "
                f"{job.get('with.siblings', '')!r}; {pkg} declares {want!r}"
            )
        gate = f"needs.changes.outputs.{pkg} == 'true'"
        if gate not in job.get("if", ""):
            problems.append(f"{CI_WORKFLOW}: job {job_name!r} must run only if {gate}")
        if f"outputs.{pkg}" not in changes:
            problems.append(f"{CI_WORKFLOW}: job 'changes' has no output {pkg!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    aff = sub.add_parser("affected", help="name=true|false per package, for $GITHUB_OUTPUT")
    aff.add_argument("--base", help="git ref; changes since its merge base with HEAD count")
    sub.add_parser("check-matrix", help="ci.yml lists exactly the packages under packages/")
    args = parser.parse_args(argv)
    if args.command == "check-matrix":
        problems = check_matrix()
        for p in problems:
            print(p, file=sys.stderr)
        if not problems:
            print(f"{CI_WORKFLOW}: one job per package, siblings as declared")
        return 1 if problems else 0
    deps = sibling_deps()
    changed = changed_files(args.base)
    run = set(deps) if changed is None else affected(changed, deps)
    why = "no usable base: every package" if changed is None else f"{len(changed)} files changed"
    print(
        f"{why}; runs: {' '.join(p for p in install_order(deps) if p in run) or 'none'}",
        file=sys.stderr,
    )
    for name in install_order(deps):
        print(f"{name}={'true' if name in run else 'false'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
