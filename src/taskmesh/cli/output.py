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


def clean(value: Any, *, newlines: bool = False) -> str:
    """``value`` as text a terminal shows as it is: control characters (an escape sequence that
    would move the cursor, clear the screen or set the title) are written as ``\\x1b``, ``\\n``...

    :param newlines: keep line breaks (a traceback), escape the rest.
    """
    text = str(value)
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or (newlines and c == "\n") else c.encode("unicode_escape").decode("ascii") for c in text
    )


CUT_COLUMN = "ERROR"
"""The column a narrow terminal cuts with an ellipsis; the others (ids above all) never wrap or shrink."""


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None) -> None:
    """Print rows under a header; ``None`` cells print as ``-``, the rest as plain text (:func:`clean`).

    On a terminal too narrow for the rows, only the ``ERROR`` column is cut (with ``…``); into a
    pipe nothing is cut or wrapped.
    """
    cells = [[Text("-" if cell is None else clean(cell)) for cell in row] for row in rows]
    console = stdout_console()
    widths = [max([len(column), *(row[i].cell_len for row in cells)]) for i, column in enumerate(columns)]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title=title, title_justify="left")
    for i, column in enumerate(columns):
        most = None
        if column == CUT_COLUMN and console.is_terminal:
            # What the other columns leave of the terminal's width (2 spaces between columns).
            most = max(10, console.width - sum(w for j, w in enumerate(widths) if j != i) - 2 * (len(columns) - 1))
        keep = None if column == CUT_COLUMN else widths[i]
        table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=most, min_width=keep)
    for row in cells:
        table.add_row(*row)
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
        table.add_row(Text(name), Text("-" if value is None else clean(value)))
    _print(table)


def say(text: str, *, newlines: bool = False) -> None:
    """Print plain text on stdout, as one line (:func:`clean`) unless ``newlines``."""
    sys.stdout.write(clean(text, newlines=newlines) + "\n")
    sys.stdout.flush()


def note(text: str) -> None:
    """Print one line for the person on stderr (kept out of stdout's data), never wrapped."""
    sys.stderr.write(clean(text) + "\n")
    sys.stderr.flush()


def _utc(value: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo is not None else moment


def when(value: str | None) -> str | None:
    """An ISO 8601 time from the API as ``YYYY-MM-DD HH:MM:SS`` UTC (``None`` stays ``None``)."""
    moment = None if value is None else _utc(value)
    return value if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def ago(value: str | None, now: datetime | None = None) -> str | None:
    """How long before ``now`` an ISO 8601 time was, for people: ``4s``, ``3m``, ``2h``, ``5d``."""
    moment = None if value is None else _utc(value)
    return value if moment is None else duration((now or datetime.now(UTC)) - moment)


def duration(delta: Any) -> str:
    """A ``timedelta`` or seconds as the largest whole unit: ``850ms``, ``4s``, ``3m``, ``2h``, ``5d``."""
    seconds = delta.total_seconds() if hasattr(delta, "total_seconds") else float(delta)
    if seconds < 1:
        return f"{max(seconds, 0) * 1000:.0f}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def one_line(text: str | None) -> str | None:
    """The first line of ``text`` (a table cell for an error; a terminal cuts it to fit)."""
    if text is None:
        return None
    return text.strip().splitlines()[0] if text.strip() else ""
