"""The guides and deploy/ point at each other: every deploy file is in the deployment guide, every
path the docs name exists, every docs page a deploy file names exists, every alert has its section."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DEPLOYMENT = DOCS / "guides" / "deployment.md"
MONITORING = DOCS / "guides" / "monitoring.md"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"


def test_the_deployment_guide_names_every_deploy_file() -> None:
    """A file added to deploy/ gets a line in the guide's table of deploy files."""
    text = DEPLOYMENT.read_text()
    shipped = [p.relative_to(ROOT).as_posix() for p in (ROOT / "deploy").rglob("*") if p.is_file()]
    assert shipped
    missing = [path for path in shipped if f"`{path}`" not in text and f"`{Path(path).parent.as_posix()}/`" not in text]
    assert missing == []


def test_every_repository_path_the_docs_name_exists() -> None:
    """``deploy/...``, ``tests/...``, ``benchmarks/...`` and ``examples/...`` in code spans name real files."""
    named: set[str] = set()
    for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]:
        named |= set(re.findall(r"`((?:deploy|tests|benchmarks|examples)/[\w./-]+)`", page.read_text()))
    assert any(n.startswith("deploy/") for n in named)
    assert [n for n in sorted(named) if not (ROOT / n).exists()] == []


def test_every_docs_page_a_deploy_file_names_exists() -> None:
    """The comments of deploy/ point readers at docs pages (alerts, dashboard): those pages exist."""
    named = {
        ref
        for path in (ROOT / "deploy").rglob("*")
        if path.is_file()
        for ref in re.findall(r"\bdocs/[\w/-]+\.md", path.read_text(errors="replace"))
    }
    assert "docs/guides/monitoring.md" in named
    assert [ref for ref in sorted(named) if not (ROOT / ref).is_file()] == []


def test_every_alert_has_a_section_in_the_monitoring_guide() -> None:
    alerts = set(re.findall(r"^\s*- alert: (\w+)\s*$", RULES.read_text(), flags=re.MULTILINE))
    headings = set(re.findall(r"^### (Taskmesh\w+)\s*$", MONITORING.read_text(), flags=re.MULTILINE))
    assert alerts
    assert alerts - headings == set()
