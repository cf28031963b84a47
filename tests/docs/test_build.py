"""The docs site builds with ``mkdocs build --strict`` and needs nothing from the network to be read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REMOTE = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.IGNORECASE)


def test_the_site_builds_strict_and_offline(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not warnings, done.stderr[-4000:]
    pages = list(site.rglob("*.html"))
    assert len(pages) > 30
    remote = {page.relative_to(site).as_posix(): REMOTE.findall(page.read_text()) for page in pages}
    assert {page: found for page, found in remote.items() if found} == {}
    assert not list(site.rglob("*.woff2")) or (site / "assets").is_dir()
    assert "fonts.googleapis.com" not in (site / "index.html").read_text()


def test_no_page_has_an_empty_link() -> None:
    """``[text]()`` links to its own page, which mkdocs lets through: a link whose target was lost."""
    empty = [p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md") if "]()" in p.read_text()]
    assert empty == []
