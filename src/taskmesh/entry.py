"""The ``taskmesh`` command's entry point: kept light, so that Ctrl-C while the command line
loads (typer, rich, httpx: a few tenths of a second) ends it with status 130, quietly.

The interrupt is noted rather than raised while the modules load: a ``KeyboardInterrupt``
raised in the middle of an extension module's import can leave the interpreter unable to
exit cleanly (a crash was seen here).

A bare start of an instance (:data:`BARE_RUN`: ``taskmesh``, ``python -m taskmesh``,
``taskmesh run``) loads only what runs it, not Typer and the operator's verbs: about 60 ms
less CPU at every start (0.571 s against 0.634 s; docs/internals/benchmark-notebook.md, "A bare
start"). ``taskmesh worker`` and ``taskmesh migrate`` run the same way, so that the base install
(``pip install taskmesh``, without the ``cli`` extra) can migrate and work.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType

BARE: dict[tuple[str, ...], str] = {(): "run", ("run",): "run", ("worker",): "worker", ("migrate",): "migrate"}
"""Command lines (after the program's name) run without loading the command line, and the function of
:mod:`taskmesh.cli.instance` each calls: an instance, its workers alone without HTTP, the migrations.
What runs without the ``cli`` extra (``pip install taskmesh`` alone; ``run`` needs ``server``)."""
VERSION: list[str] = ["--version"]
"""The command line (after the program's name) that prints the version: answered here, without the ``cli``
extra, as the command line's own ``--version`` does (``taskmesh 0.2.0``)."""


def main() -> None:
    """Load the command line and run it (:func:`taskmesh.cli.app.exit_main`), or for a :data:`BARE` command
    line only its function of :mod:`taskmesh.cli.instance` (its ends mapped by :mod:`taskmesh.cli.exits`)."""
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
        bare = BARE.get(tuple(args))
        start = _bare(bare) if bare is not None else _command_line()
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        sys.exit(130)
    start()


def _bare(name: str) -> Callable[[], None]:
    """The function ``name`` of :mod:`taskmesh.cli.instance`, its end mapped to an exit status."""
    from taskmesh.cli import exits, instance

    command: Callable[[], None] = getattr(instance, name)
    return lambda: exits.exit_process(exits.run(command))


def _command_line() -> Callable[[], None]:
    from taskmesh.errors import ConfigError
    from taskmesh.extras import require_extra

    try:
        require_extra(
            "cli",
            "the command line",
            hint="taskmesh worker and taskmesh migrate run without it, taskmesh run with the 'server' extra alone",
        )
    except ConfigError as exc:
        from taskmesh.cli.exit_codes import ExitCode
        from taskmesh.cli.exits import error

        error(exc)
        return lambda: sys.exit(ExitCode.USAGE)
    from taskmesh.cli.app import exit_main

    return exit_main
