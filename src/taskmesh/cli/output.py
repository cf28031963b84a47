"""What the operator verbs print: tables and lines for people, the API's JSON for scripts.

Every value from the API is printed as plain text (never as rich markup), so a task
name, an error or a reason cannot restyle or hide the output. Tables go to stdout;
progress and notes go to stderr, so ``--json`` output and pipes stay clean.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 1000
"""Columns of a table written to a pipe or file: wide enough that nothing wraps or is cut."""


def stdout_console() -> Console:
    """A console on stdout; not a terminal, it neither wraps nor colours (``grep`` and ``awk`` see one row a line)."""
    if sys.stdout.isatty():
        return Console(highlight=False, markup=False)
    width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else PIPE_WIDTH
    return Console(highlight=False, markup=False, width=width, no_color=True, soft_wrap=True)


def stderr_console() -> Console:
    """A console on stderr, for progress bars and notes."""
    return Console(stderr=True, highlight=False, markup=False)


def print_json(value: Any) -> None:
    """Print ``value`` as one line of JSON on stdout (the API's own shape, for scripts)."""
    sys.stdout.write(orjson.dumps(value).decode() + "\n")
    sys.stdout.flush()


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None) -> None:
    """Print rows under a header; ``None`` cells print as ``-``, the rest as plain text."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text("-" if cell is None else str(cell)) for cell in row))
    _print(table)


def _print(renderable: Any) -> None:
    """Print on stdout; into a pipe without the padding rich leaves at the end of each line."""
    console = stdout_console()
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    sys.stdout.flush()


def print_fields(pairs: Iterable[tuple[str, Any]]) -> None:
    """Print ``name  value`` lines, one per field, values as plain text."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, value in pairs:
        table.add_row(Text(name), Text("-" if value is None else str(value)))
    _print(table)


def say(text: str) -> None:
    """Print one line of plain text on stdout."""
    stdout_console().print(Text(text))


def note(text: str) -> None:
    """Print one line for the person on stderr (kept out of stdout's data)."""
    stderr_console().print(Text(text))


def when(value: str | None) -> str | None:
    """An ISO 8601 time from the API as ``YYYY-MM-DD HH:MM:SS`` UTC (``None`` stays ``None``)."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def ago(value: str | None, now: datetime | None = None) -> str | None:
    """How long before ``now`` an ISO 8601 time was, for people: ``4s``, ``3m``, ``2h``, ``5d``."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    return duration((now or datetime.now(UTC)) - moment.astimezone(UTC))


def duration(delta: Any) -> str:
    """A ``timedelta`` or seconds as the largest whole unit: ``850ms``, ``4s``, ``3m``, ``2h``, ``5d``."""
    seconds = delta.total_seconds() if hasattr(delta, "total_seconds") else float(delta)
    if seconds < 1:
        return f"{max(seconds, 0) * 1000:.0f}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def one_line(text: str | None, most: int = 80) -> str | None:
    """The first line of ``text`` cut to ``most`` characters (a table cell for an error)."""
    if text is None:
        return None
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= most else first[: most - 1] + "…"
