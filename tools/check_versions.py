"""Flag packages whose code changed without a changelog entry, since a base git ref.

The packages are versioned independently: a change under ``packages/X/src`` since the
merge base of BASE and HEAD needs a new entry (a ``- `` line) in
``packages/X/CHANGELOG.md``, under ``## Unreleased`` or under a new version's heading.
A changed ``__version__`` must grow and have its own ``## <version>`` heading there.

    python tools/check_versions.py --base origin/main    # exit 1 when any is flagged
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout


def _version_file(package: Path) -> Path:
    files = sorted(package.glob("src/*/__init__.py"))
    if len(files) != 1:
        raise ValueError(f"{package}: expected one src/<module>/__init__.py, found {files}")
    return files[0]


def _version_tuple(version: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        raise ValueError(f"__version__ {version!r}: expected dotted integers such as 0.1.0")
    return tuple(int(p) for p in version.split("."))


def check(base: str, root: Path = ROOT) -> list[str]:
    """One message per package flagged between the merge base of ``base`` and HEAD."""
    try:
        merge_base = _git(root, "merge-base", base, "HEAD").strip()
    except subprocess.CalledProcessError as e:
        raise ValueError(f"--base {base!r}: no merge base with HEAD ({e.stderr.strip()})") from None
    changed = _git(root, "diff", "--name-only", merge_base, "HEAD").splitlines()
    problems = []
    for package in sorted(p.parent for p in (root / "packages").glob("*/pyproject.toml")):
        name = package.name
        prefix = f"packages/{name}/"
        src = [f for f in changed if f.startswith(prefix + "src/")]
        log = prefix + "CHANGELOG.md"
        version_path = _version_file(package).relative_to(root).as_posix()
        new = VERSION.search((root / version_path).read_text())
        if new is None:
            problems.append(f"{name}: {version_path} sets no __version__")
            continue
        try:
            old_text = _git(root, "show", f"{merge_base}:{version_path}")
        except subprocess.CalledProcessError:
            old_text = ""  # a package new since the base
        old = VERSION.search(old_text)
        added = ""
        if log in changed:
            diff = _git(root, "diff", "--unified=0", merge_base, "HEAD", "--", log)
            added = "\n".join(
                line[1:]
                for line in diff.splitlines()
                if line.startswith("+") and not line.startswith("+++")
            )
        if src and not re.search(r"^- \S", added, re.M):
            problems.append(
                f"{name}: {len(src)} file(s) under {prefix}src changed since {base} "
                f"(e.g. {src[0]}) but {log} has no new '- ' entry"
            )
        if old and old.group(1) != new.group(1):
            if _version_tuple(new.group(1)) <= _version_tuple(old.group(1)):
                problems.append(f"{name}: __version__ went {old.group(1)} -> {new.group(1)}")
            changelog = (root / log).read_text() if (root / log).exists() else ""
            if not re.search(rf"^## {re.escape(new.group(1))}\b", changelog, re.M):
                problems.append(
                    f"{name}: version {new.group(1)} has no '## {new.group(1)}' heading in {log}"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git ref to compare HEAD against")
    args = parser.parse_args(argv)
    try:
        problems = check(args.base)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"versions: every package changed since {args.base} has a changelog entry")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
