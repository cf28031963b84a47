"""Every command's ``--help`` as a person reads it: what each flag takes, never a Python type name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer
from typer.core import TyperOption
from typer.testing import CliRunner

from taskmesh.cli.app import app

PYTHON_TYPE = re.compile(r"<[a-z][a-z_ \[\],|]*>")
"""How Typer shows a parameter without a metavar: ``<bool>``, ``<str>``, ``<int range>``, ``<list[str]>``."""
METAVAR = re.compile(r"[A-Z][A-Z_]*(=[A-Z][A-Z_]*)?")
"""A metavar a person reads as what to type: ``N``, ``QUEUE``, ``PATH=VALUE``."""


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the tree, groups included, with its path of names."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def helped(path: tuple[str, ...]) -> str:
    """``taskmesh PATH --help`` as printed, on a screen wide enough that no cell wraps."""
    ran = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250", "TERM": "dumb"}, prog_name="taskmesh")
    assert ran.exit_code == 0, (path, ran.output)
    return ran.output


def rows(text: str) -> dict[str, list[str]]:
    """The help's panel rows by their first name (``--limit``, ``ID``): the cells after it and its short
    names, split on runs of 2+ spaces (a row that only goes on with help text is left out)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("\u2502"):
            continue
        cells = [c for c in re.split(r"\s{2,}", line.strip("\u2502 ")) if c and c != "*"]
        if cells and (cells[0].startswith("--") or cells[0].isupper()):
            out.setdefault(cells[0], [c for c in cells[1:] if not re.fullmatch(r"-[a-z]", c)])
    return out


def test_every_commands_help_names_what_each_flag_takes_and_no_python_type() -> None:
    root = typer.main.get_command(app)
    checked = []
    for path, command in commands(root):
        text = helped(path)
        assert PYTHON_TYPE.findall(text) == [], (path, text)
        shown = rows(text)
        for param in command.params:
            name = param.opts[0] if isinstance(param, TyperOption) else param.metavar
            assert param.help and name in shown, (path, param.name, shown)
            first = shown[name][0]
            if isinstance(param, TyperOption) and param.is_flag:
                # A flag takes no value: its help comes right after its names.
                assert first.startswith(param.help[:20]), (path, name, shown[name])
            else:
                # An option's value or an argument: a word a person types (QUEUE, N, PATH=VALUE).
                assert param.metavar and METAVAR.fullmatch(param.metavar), (path, param.name, param.metavar)
                if isinstance(param, TyperOption):
                    assert first.split(" [")[0] == param.metavar, (path, name, shown[name])
                else:
                    assert first.startswith(param.help[:20]), (path, name, shown[name])
        assert "--help" in shown and shown["--help"][0] == "Show this message and exit.", path
        checked.append(" ".join(path))
    assert {"", "tasks list", "schedules trigger", "keys create", "bulk retry", "workers"} <= set(checked)


def test_a_flag_and_an_argument_show_their_names_alone() -> None:
    listed = helped(("tasks", "list"))
    assert re.search(r"--json\s+Print the API's JSON answer", listed)
    assert re.search(r"--help\s+-h\s+Show this message and exit", listed)
    assert re.search(r"--limit\s+-l\s+N \[1<=x<=500\]\s+Tasks per page", listed)
    shown = helped(("tasks", "show"))
    assert re.search(r"\*\s+ID\s+The task's id \(a UUID\)", shown)
    assert "taskmesh tasks show [OPTIONS] {ID}" in shown
