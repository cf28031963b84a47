"""A ``def`` handler in thread mode that never returns must not keep its instance alive after SIGTERM.

Before, such a handler (``pool="thread"``, ``time.sleep(600)``) held the
shutdown: the event loop turns, so the watchdog saw nothing blocked, and the
executor waits for the thread, which cannot be stopped; a second SIGTERM
logged ``shutdown_forced`` and changed nothing. The process lived until the
backstop (30 s past the grace period), so a process manager's SIGKILL came
first. Now a handler thread still running past the grace period (plus the
watchdog's margin), or at a second signal, ends the instance through the
emergency exit: its run is handed back (queued again, no retry spent, due 2 s
later) and another instance finishes it. A thread-mode handler that returns
within the grace period still ends with a clean stop.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.proc import Proc, call, create, spawn, stores_env, task_status, wait_until

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("redis_client")]

GRACE = 2.0
MARGIN = 3.0  # shutdown_signals.MARGIN_SECONDS
HAND_BACK = 3.0  # the emergency's own connection, bounded by emergency.TIMEOUT_SECONDS


def start(spawn: Any, database_url: str, redis_url: str, prefix: str, grace: float = GRACE) -> Proc:
    env = stores_env(
        database_url,
        redis_url,
        prefix,
        TASKMESH_SHUTDOWN_GRACE_SECONDS=str(grace),
        TASKMESH_RECONCILE_INTERVAL_SECONDS="0.5",
    )
    proc: Proc = spawn(**env)
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, proc=proc)
    return proc


def start_sleeping_thread(proc: Proc, directory: Path, seconds: float) -> str:
    """Create a task whose thread-mode handler sleeps ``seconds`` on attempt 1; wait until it runs."""
    tid = create(proc, {"name": "thread_sleeps_first", "payload": {"dir": str(directory), "seconds": seconds}})
    wait_until(lambda: (directory / "attempt1.start").exists(), proc=proc)
    return tid


def exit_status(proc: Proc, timeout: float) -> int:
    """``proc``'s exit status; fails with its log when it is still running after ``timeout`` s."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after {timeout} s:\n{proc.output()[-3000:]}") from None


def emergencies(proc: Proc) -> list[str]:
    return [e["reason"] for e in proc.events() if e["event"] == "shutdown_emergency"]


async def test_sigterm_ends_an_instance_whose_thread_handler_never_returns_and_its_run_finishes_elsewhere(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    a = start(spawn, database_url, redis_url, prefix)
    tid = start_sleeping_thread(a, tmp_path, 600)
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    code = exit_status(a, GRACE + MARGIN + HAND_BACK + 5)
    took = time.monotonic() - t0
    assert code == 1, a.output()[-3000:]  # the emergency exit: the thread could not be ended otherwise
    assert GRACE <= took < GRACE + MARGIN + HAND_BACK + 2, took
    assert emergencies(a) == ["deadline"]
    assert [e["count"] for e in a.events() if e["event"] == "emergency_hand_back"] == [1]
    row = await pool.fetchrow("SELECT status, retries FROM tasks WHERE id = $1", tid)
    assert row is not None
    assert (row["status"], row["retries"]) == ("queued", 0)  # handed back, no retry spent
    assert not (tmp_path / "attempt1.end").exists()
    error = await pool.fetchval("SELECT error FROM task_runs WHERE task_id = $1 AND attempt = 1", tid)
    assert "emergency exit" in error and "handler thread" in error, error
    b = start(spawn, database_url, redis_url, prefix)
    done = wait_until(lambda: task_status(b.port, tid)["task"]["status"] == "completed" and task_status(b.port, tid))
    assert done["latest_run"]["attempt"] == 2 and done["latest_run"]["result"]["pid"] == b.pid


async def test_a_second_sigterm_ends_an_instance_whose_thread_handler_never_returns_at_once(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    a = start(spawn, database_url, redis_url, prefix, grace=30)
    tid = start_sleeping_thread(a, tmp_path, 600)
    a.signal(signal.SIGTERM)
    wait_until(lambda: any(e["event"] == "draining" for e in a.events()), proc=a)
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    code = exit_status(a, HAND_BACK + 5)
    assert code == 1, a.output()[-3000:]
    assert time.monotonic() - t0 < HAND_BACK, a.output()[-3000:]  # not the 30 s grace period
    assert emergencies(a) == ["second_signal"]
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", tid) == "queued"


async def test_sigterm_lets_a_thread_handler_that_returns_within_the_grace_period_finish(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    a = start(spawn, database_url, redis_url, prefix, grace=10)
    tid = start_sleeping_thread(a, tmp_path, 1)
    a.signal(signal.SIGTERM)
    assert exit_status(a, 15) == 0, a.output()[-3000:]  # a clean stop: no emergency
    assert emergencies(a) == []
    assert (tmp_path / "attempt1.end").exists()
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", tid) == "completed"
