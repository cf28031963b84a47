"""docs/operations.md: every file it links exists, every section it links is there, every alert has its section."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_of_the_operations_guide_resolve() -> None:
    text = DOC.read_text()
    anchors = {anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        path, _, fragment = link.partition("#")
        if path:
            assert (DOC.parent / path).resolve().exists(), link
        else:
            assert fragment in anchors, link


def test_the_operations_guide_links_every_deploy_file() -> None:
    """A file added to deploy/ gets a line in the guide's table of deploy files."""
    text = DOC.read_text()
    shipped = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "deploy").rglob("*")
        if p.is_file() and not p.name.endswith(".dockerignore")
    ]
    assert shipped
    for path in shipped:
        assert f"({'../' + path})" in text, path


def test_every_alert_has_a_section_in_the_operations_guide() -> None:
    alerts = set(re.findall(r"^\s*- alert: (\w+)\s*$", RULES.read_text(), flags=re.MULTILINE))
    headings = set(re.findall(r"^### (Taskmesh\w+)\s*$", DOC.read_text(), flags=re.MULTILINE))
    assert alerts
    assert alerts - headings == set()
