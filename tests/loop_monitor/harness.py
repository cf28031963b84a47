"""Run ``program.py`` as a real process and read its JSON log lines."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

PROGRAM = Path(__file__).with_name("program.py")
ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["asyncio", "uvloop"]


class Program:
    """One run of ``program.py``: its process, its log, and its emergency marker file."""

    def __init__(self, popen: subprocess.Popen[bytes], log: Path, marker: Path) -> None:
        self.popen = popen
        self.log = log
        self.marker = marker

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON lines logged so far (those named ``name`` only, when given)."""
        out = []
        for line in self.output().splitlines():
            if line.startswith("{"):
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:  # a line still being written
                    continue
                if name is None or event.get("event") == name:
                    out.append(event)
        return out

    def wait_for(self, name: str, timeout: float = 5.0) -> dict[str, Any]:
        """The first ``name`` line; fails after ``timeout`` s or when the process ends without it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.events(name)
            if found:
                return found[0]
            if self.popen.poll() is not None:
                break
            time.sleep(0.02)
        found = self.events(name)
        if found:
            return found[0]
        raise AssertionError(f"no {name} within {timeout} s (exit status {self.popen.poll()}):\n{self.output()}")

    def signal(self, signum: int = signal.SIGTERM) -> float:
        """Send ``signum``; returns when it was sent (``time.monotonic()``)."""
        self.popen.send_signal(signum)
        return time.monotonic()

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.output()}") from None


def line_of(marker: str, path: Path = PROGRAM) -> int:
    """Number of the line of ``path`` that holds ``marker``."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker!r} not in {path}")
