"""Module-level handlers the process pool tests run in child processes (imported there by name)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel

from taskmesh.errors import NonRetryableError, RateLimited, Retry
from taskmesh.tasks.models import TaskContext


class Order(BaseModel):
    order_id: int
    note: str = ""


def echo(payload: Any) -> Any:
    """Returns its payload."""
    return payload


def whoami(payload: Any) -> int:
    """Returns the pid of the process running it."""
    return os.getpid()


def order_total(payload: Order) -> dict[str, Any]:
    """Needs an :class:`Order`; says which type it got."""
    return {"order_id": payload.order_id, "type": type(payload).__name__}


def with_ctx(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    """Returns what it learnt from its context."""
    return {"attempt": ctx.attempt, "task_id": str(ctx.task_id)}


def log_a_line(payload: Any) -> None:
    """Logs one structlog line (to see which keys it carries)."""
    structlog.get_logger("tests.handler").info("handler_said_hello", marker=payload["marker"])


def fail(payload: Any) -> None:
    raise ValueError(payload.get("message", "bad"))


def _ping(depth: int, message: str) -> None:
    if depth == 0:
        innermost_frame_marker(message)
    _pong(depth - 1, message)


def _pong(depth: int, message: str) -> None:
    _ping(depth, message)


def innermost_frame_marker(message: str) -> None:
    raise RuntimeError(message)


def fail_deep(payload: Any) -> None:
    """Raises from ``depth`` alternating frames down: a traceback of tens of KiB."""
    _ping(int(payload["depth"]), payload.get("message", "deep down"))


def refuse(payload: Any) -> None:
    raise NonRetryableError("no such customer")


def retry_later(payload: Any) -> None:
    raise Retry("rate limited", delay_seconds=30)


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def fail_badly(payload: Any) -> None:
    raise BadStr()


def exit_the_handler(payload: Any) -> None:
    sys.exit(4)


def unserialisable(payload: Any) -> object:
    return object()


def lone_surrogate(payload: Any) -> str:
    return "abc\ud800"


def fail_with_surrogate(payload: Any) -> None:
    raise ValueError("bad \ud800 and nul \x00 here")


def write_pid_and_sleep(payload: dict[str, Any]) -> None:
    """Writes its pid to ``payload["pid_file"]``, then sleeps ``seconds`` (60)."""
    Path(payload["pid_file"]).write_text(str(os.getpid()))
    time.sleep(float(payload.get("seconds", 60)))


def sleep_then_mark(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Writes its pid to ``pid.<attempt>`` in ``payload["dir"]``, sleeps ``seconds``, then writes
    ``done.<attempt>`` there: a handler stopped in its sleep never writes the second file."""
    folder = Path(payload["dir"])
    (folder / f"pid.{ctx.attempt}").write_text(str(os.getpid()))
    time.sleep(float(payload["seconds"]))
    (folder / f"done.{ctx.attempt}").write_text(str(os.getpid()))


def rate_limited_first(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Writes ``<pid> <time.monotonic()>`` to ``<n>.<attempt>`` in ``payload["dir"]`` as it starts (CLOCK_MONOTONIC:
    one clock for every process of the host), then raises ``RateLimited(retry_after=2)`` on the first attempt of
    the task whose ``n`` is ``first``."""
    (Path(payload["dir"]) / f"{payload['n']}.{ctx.attempt}").write_text(f"{os.getpid()} {time.monotonic()!r}")
    if payload["n"] == "first" and ctx.attempt == 1:
        raise RateLimited(retry_after=2)


def ignore_sigterm_and_sleep(payload: dict[str, Any]) -> None:
    """Ignores SIGTERM, writes its pid, sleeps: only SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write_pid_and_sleep(payload)


def exit_3(payload: Any) -> None:
    os._exit(3)


def segfault(payload: Any) -> None:
    ctypes.string_at(0)


def burn_cpu(payload: dict[str, Any]) -> dict[str, float]:
    """Spins for ``seconds`` of wall time; returns its start and end (epoch seconds)."""
    start = time.time()
    n = 0
    while time.time() - start < float(payload["seconds"]):
        n += 1
    return {"start": start, "end": time.time()}


async def coroutine_handler(payload: Any) -> None:
    """Async: belongs on the event loop, not in a handler process."""


def preloaded(payload: Any) -> bool:
    """Whether the slow module was imported in this process before this call."""
    return "tests.process_pool.slow_import" in sys.modules


class Jobs:
    @staticmethod
    def double(payload: int) -> int:
        return payload * 2
