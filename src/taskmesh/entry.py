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
BARE_WORKER: list[str] = ["worker"]
"""The command line (after the program's name) that starts an instance's workers alone, without HTTP:
with :data:`BARE_RUN`, what runs without the ``cli`` extra (``pip install taskmesh`` alone)."""
VERSION: list[str] = ["--version"]
"""The command line (after the program's name) that prints the version: answered here, without the ``cli``
extra, as the command line's own ``--version`` does (``taskmesh 0.2.0``)."""


def main() -> None:
    """Load the command line and run it (:func:`taskmesh.cli.app.exit_main`), or for :data:`BARE_RUN`
    only the instance (:func:`taskmesh.cli.instance.run`, its ends mapped by :mod:`taskmesh.cli.exits`)."""
    pressed: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pressed.append(signum)

    previous = signal.signal(signal.SIGINT, note)
    try:
        args = sys.argv[1:]
        if args == VERSION:
            from taskmesh import __version__

            print(f"taskmesh {__version__}")
            return
        start = _bare_run() if args in BARE_RUN else _bare_worker() if args == BARE_WORKER else _command_line()
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        sys.exit(130)
    start()


def _bare_run() -> Callable[[], None]:
    from taskmesh.cli import exits, instance

    return lambda: exits.exit_process(exits.run(instance.run))


def _bare_worker() -> Callable[[], None]:
    from taskmesh.cli import exits, instance

    return lambda: exits.exit_process(exits.run(instance.worker))


def _command_line() -> Callable[[], None]:
    from taskmesh.errors import ConfigError
    from taskmesh.extras import require_extra

    try:
        require_extra("cli", "the command line", hint="taskmesh run and taskmesh worker run without it")
    except ConfigError as exc:
        from taskmesh.cli.exit_codes import ExitCode
        from taskmesh.cli.exits import error

        error(exc)
        return lambda: sys.exit(ExitCode.USAGE)
    from taskmesh.cli.app import exit_main

    return exit_main
