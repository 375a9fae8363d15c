"""Code and docs cite benchmark sections that exist, by date and title, quote benchmark
commands that exist, and never cite work sessions or tracker issue numbers."""

import itertools
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^#+ (\d{4}-\d{2}-\d{2}) (.+?)\s*$", re.M)
# The current figures, and the dated log of how they were reached (moved out of
# BENCHMARKS.md: a citation of BENCHMARKS.md may name a section of either).
BENCHMARKS, LOG = "BENCHMARKS.md", "docs/benchmark-log.md"
# "BENCHMARKS.md, 2026-12-03 'Casts: word stores'" or "docs/benchmark-log.md, ...",
# possibly wrapped over comment lines; an apostrophe inside a title precedes a letter.
CITATION = re.compile(
    r"(BENCHMARKS\.md|docs/benchmark-log\.md), (\d{4}-\d{2}-\d{2}) '((?:[^']|'(?=[a-z]))+)'"
)
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


def _sections(name: str) -> set[tuple[str, str]]:
    return set(HEADING.findall((ROOT / name).read_text()))


def test_benchmark_citations_name_existing_sections():
    in_log = _sections(LOG)
    where = {BENCHMARKS: _sections(BENCHMARKS) | in_log, LOG: in_log}
    cited = []
    for path in _tracked_text_files():
        for doc, date, title in CITATION.findall(_flat(path.read_text(errors="replace"))):
            cited.append((path.relative_to(ROOT), date, title))
            assert (date, title) in where[doc], (
                f"{path.relative_to(ROOT)} cites {doc}, {date} '{title}', which is not a "
                f"section heading there"
            )
    assert cited  # the check itself found the citations


BENCH = ROOT / "tools" / "bench"
# A quoted command: a `code span`, possibly wrapped over lines.
CODE_SPAN = re.compile(r"`([^`]+)`")


def test_quoted_benchmark_commands_name_existing_scripts_and_flags():
    # Commands run from the repository root or from tools/bench; package tests are
    # also quoted by bare name.
    checked = 0
    for doc in (BENCHMARKS, LOG, "tools/bench/diagnostics/README.md"):
        for span in CODE_SPAN.findall((ROOT / doc).read_text()):
            words = span.split()
            for i, word in enumerate(words):
                if not word.endswith(".py"):
                    continue
                found = [p for p in (ROOT / word, BENCH / word) if p.is_file()]
                if "/" not in word:
                    found += list((ROOT / "packages").glob(f"*/tests/{word}"))
                assert found, f"{doc} quotes `{span}`: {word} is no file"
                if BENCH not in found[0].parents:
                    continue
                text = found[0].read_text()
                for flag in (w.split("=")[0] for w in words[i + 1 :] if w.startswith("--")):
                    assert f'"{flag}"' in text, f"{doc} quotes `{span}`: {word} has no {flag}"
                checked += 1
    assert checked  # the check itself found the commands


def test_no_work_sessions_or_tracker_issues_cited():
    hits = []
    for path in _tracked_text_files():
        if path == pathlib.Path(__file__):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if LAB_NOTEBOOK.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "cite a BENCHMARKS.md section, a test or a commit instead:\n" + "\n".join(hits)


def test_benchmarks_open_with_a_short_status_table():
    # The first table of BENCHMARKS.md is the status a reader wants first: 15 lines at most
    # (header and rule included), every row naming a target, a commit and a status.
    lines = (ROOT / BENCHMARKS).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert not any(line.startswith("#") for line in lines[1:start]), "status table first"
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    assert len(table) <= 15, f"the status table has {len(table)} lines; keep it to 15"
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header[:2] == ["benchmark", "target"] and header[-2:] == ["commit", "status"]
    for row in table[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == len(header) and all(cells), row
