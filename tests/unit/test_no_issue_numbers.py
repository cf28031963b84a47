"""Code and docs name features, never the numbers of a tracker that does not ship with them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("src", "tests", "docs", "examples", "benchmarks", "deploy", "README.md", "CHANGELOG.md", "Makefile")
ISSUE = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".sql", ".lua", ".html", ".css", ".js", ".toml", ".yml", ".yaml", ".ini", ".conf", ""}


def issue_mentions(paths: list[Path]) -> list[str]:
    """``path:line: text`` of every line in ``paths`` (files, or directories walked) naming an issue number."""
    found = []
    for top in paths:
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if not path.is_file() or path.suffix not in TEXT_SUFFIXES or "__pycache__" in path.parts:
                continue
            if path.resolve() == Path(__file__).resolve():
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if ISSUE.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_file_names_an_issue_number() -> None:
    found = issue_mentions([ROOT / name for name in SCANNED if (ROOT / name).exists()])
    assert not found, "name the feature, not an issue number:\n" + "\n".join(found)


def test_the_scan_finds_a_planted_mention() -> None:
    planted = ROOT / "tests" / "unit" / "_planted_issue_mention.md"
    planted.write_text("a note\nthe console (issue 13) shows it\n")
    try:
        assert issue_mentions([planted]) == ["tests/unit/_planted_issue_mention.md:2: the console (issue 13) shows it"]
    finally:
        planted.unlink()
