"""The ``taskmesh`` command's entry point: kept light, so that Ctrl-C while the command line
loads (typer, rich, httpx: a few tenths of a second) ends it with status 130, quietly.

The interrupt is noted rather than raised while the modules load: a ``KeyboardInterrupt``
raised in the middle of an extension module's import can leave the interpreter unable to
exit cleanly (a crash was seen here).

A bare start of an instance (:data:`BARE_RUN`: ``taskmesh``, ``python -m taskmesh``,
``taskmesh run``) loads only what runs it, not Typer and the operator's verbs: about 60 ms
less CPU at every start (0.571 s against 0.634 s; ``docs/benchmarks.md``, "A bare start").
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType

BARE_RUN: tuple[list[str], ...] = ([], ["run"])
"""Command lines (after the program's name) that start an instance without loading the command line."""


def main() -> None:
    """Load the command line and run it (:func:`taskmesh.cli.app.exit_main`), or for :data:`BARE_RUN`
    only the instance (:func:`taskmesh.cli.instance.run`, its ends mapped by :mod:`taskmesh.cli.exits`)."""
    pressed: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pressed.append(signum)

    previous = signal.signal(signal.SIGINT, note)
    try:
        start = _bare_run() if sys.argv[1:] in BARE_RUN else _command_line()
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        sys.exit(130)
    start()


def _bare_run() -> Callable[[], None]:
    from taskmesh.cli import exits, instance

    return lambda: exits.exit_process(exits.run(instance.run))


def _command_line() -> Callable[[], None]:
    from taskmesh.cli.app import exit_main

    return exit_main
