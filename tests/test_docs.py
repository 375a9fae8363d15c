"""Code and docs cite BENCHMARKS.md sections that exist, by date and title, and never
work sessions or tracker issue numbers."""

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^#+ (\d{4}-\d{2}-\d{2}) (.+?)\s*$", re.M)
# "BENCHMARKS.md, 2026-12-03 'Casts: word stores'", possibly wrapped over comment lines.
CITATION = re.compile(r"BENCHMARKS\.md, (\d{4}-\d{2}-\d{2}) '([^']+)'")
# This tracker's issues have small numbers; an upstream one ("pytorch issue 141234") may
# be cited. "run 3" only means something in a lab notebook's order.
LAB_NOTEBOOK = re.compile(r"\bsessions? \d|\(session|session-\d|\bissues? \d{1,2}\b|\brun \d", re.I)


def _tracked_text_files() -> list[pathlib.Path]:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files"], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    suffixes = {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".txt", ""}
    return [
        ROOT / f
        for f in out.splitlines()
        if pathlib.Path(f).suffix in suffixes and (ROOT / f).is_file()
    ]


def _flat(text: str) -> str:
    # Join wrapped comment and docstring lines so a citation reads as one line.
    return re.sub(r"\s*\n\s*(?:#+\s*)?", " ", text)


def test_benchmark_citations_name_existing_sections():
    sections = set(HEADING.findall((ROOT / "BENCHMARKS.md").read_text()))
    cited = []
    for path in _tracked_text_files():
        for date, title in CITATION.findall(_flat(path.read_text(errors="replace"))):
            cited.append((path.relative_to(ROOT), date, title))
            assert (date, title) in sections, (
                f"{path.relative_to(ROOT)} cites BENCHMARKS.md, {date} '{title}', which is "
                f"not a section heading there"
            )
    assert cited  # the check itself found the citations


def test_no_work_sessions_or_tracker_issues_cited():
    hits = []
    for path in _tracked_text_files():
        if path == pathlib.Path(__file__):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if LAB_NOTEBOOK.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "cite a BENCHMARKS.md section, a test or a commit instead:\n" + "\n".join(hits)
