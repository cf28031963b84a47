"""Helpers of the process pool tests: handler references, pid files, process liveness."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from structlog.testing import capture_logs

from taskmesh.runtime.process_pool import HandlerRef

ROOT = Path(__file__).resolve().parents[2]

both_loops = pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param("asyncio", id="asyncio"), pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")],
)
"""Run the marked test on asyncio and on uvloop."""


def ref(func: Callable[..., Any]) -> HandlerRef:
    """The reference of a handler of :mod:`tests.process_pool.handlers` (which all have one)."""
    found = HandlerRef.of(func)
    assert found is not None, func
    return found


@contextlib.contextmanager
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """This process's structlog events of the block, at every level, whatever level the session set."""
    saved = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(wrapper_class=saved)


def pid_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped by its new parent, is not)."""
    if sys.platform.startswith("linux"):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return False
        state = stat.rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def pid_from(path: Path, timeout: float = 10.0) -> int:
    """The pid a handler wrote to ``path``, once it is there."""
    file = anyio.Path(path)
    with anyio.fail_after(timeout):
        while not await file.exists() or not await file.read_text():
            await anyio.sleep(0.01)
    return int(await file.read_text())


def pid_from_sync(path: Path, timeout: float = 10.0) -> int:
    """:func:`pid_from` for a test without an event loop (``anyio.run`` inside a test refuses to start
    once the anyio plugin's runner lives on for session-scoped async fixtures)."""
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no pid in {path} after {timeout} s")
        time.sleep(0.01)
    return int(path.read_text())


def wait_gone(pid: int, timeout: float) -> bool:
    """Poll until ``pid`` is no longer running; ``False`` when it still is after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while pid_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
