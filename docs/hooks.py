"""mkdocs hooks of the docs site (mkdocs.yml, ``hooks``).

A pipe inside a code span of a table is written ``\\|`` in the pages, as GitHub's tables need it;
Python-Markdown's tables already keep a code span's pipes in their cell, and would show the
backslash. The hook drops it inside code spans before the page is rendered.
"""

from __future__ import annotations

import re
from typing import Any

CODE_SPAN = re.compile(r"`[^`\n]+`")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page's markdown with ``\\|`` inside code spans of table rows turned into ``|``."""
    lines = []
    for line in markdown.split("\n"):
        if line.startswith("|") and "\\|" in line:
            line = CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
        lines.append(line)
    return "\n".join(lines)
