"""The ``start`` fixture: ``program.py`` as a real process, killed at teardown."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.loop_monitor.harness import PROGRAM, ROOT, Program


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Program]]:
    """Start ``program.py`` with the given options; the process is killed at teardown."""
    programs: list[Program] = []

    def go(*args: str) -> Program:
        n = len(programs)
        log, marker = tmp_path / f"program-{n}.log", tmp_path / f"emergency-{n}"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, str(PROGRAM), "--marker", str(marker), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        program = Program(popen, log, marker)
        programs.append(program)
        return program

    yield go
    for program in programs:
        if program.popen.poll() is None:
            program.popen.kill()
            program.popen.wait()
