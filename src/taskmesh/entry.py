"""The ``taskmesh`` command's entry point: kept light, so that Ctrl-C while the command line
loads (typer, rich, httpx: a few tenths of a second) ends it with status 130, quietly.

The interrupt is noted rather than raised while the modules load: a ``KeyboardInterrupt``
raised in the middle of an extension module's import can leave the interpreter unable to
exit cleanly (a crash was seen here).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType


def main() -> None:
    """Load the command line and run it (see :func:`taskmesh.cli.exit_main`)."""
    pressed: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pressed.append(signum)

    previous = signal.signal(signal.SIGINT, note)
    try:
        from taskmesh.cli import exit_main
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        sys.exit(130)
    exit_main()
