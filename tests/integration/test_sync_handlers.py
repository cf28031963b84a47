"""``def`` handlers can be stopped, so two attempts of one task never run at once.

Before, a ``def`` handler ran in a thread: past its ``timeout``, or when its
task was cancelled, it kept running while the next attempt started (measured:
attempt 1's thread ran 00:07:53.8 to 56.8, attempt 2's 55.2 to 58.2). Now it
runs in a worker process that is stopped before the run's end is recorded.
Real instance processes; the handlers (tests/process_handlers.py) leave a
file per attempt when they start and when they end.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.proc import Proc, call, spawn, stores_env, task_status, wait_until

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("redis_client")]


def start(spawn: Any, database_url: str, redis_url: str, prefix: str, **extra: str) -> Proc:
    proc: Proc = spawn(**stores_env(database_url, redis_url, prefix, **extra))
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, proc=proc)
    return proc


def stamp(directory: Path, name: str) -> tuple[int, float] | None:
    path = directory / name
    if not path.exists():
        return None
    pid, at = path.read_text().split()
    return int(pid), float(at)


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


async def test_a_sync_handler_past_its_timeout_is_stopped_before_its_retry_starts(
    spawn: Any, database_url: str, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    proc = start(spawn, database_url, redis_url, prefix)
    _, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sync_slow_first", "payload": {"dir": str(tmp_path)}})
    tid = body["task_id"]
    done = wait_until(
        lambda: task_status(proc.port, tid)["task"]["status"] == "completed" and task_status(proc.port, tid)
    )
    first = stamp(tmp_path, "attempt1.start")
    second = stamp(tmp_path, "attempt2.start")
    assert first is not None and second is not None
    assert gone(first[0])  # attempt 1's process was stopped...
    time.sleep(3.5)  # ...so it never gets to its end, even after its 3 s sleep would be over
    assert stamp(tmp_path, "attempt1.end") is None
    assert done["latest_run"]["attempt"] == 2
    _, runs = call(proc.port, "GET", f"/api/v1/tasks/{tid}/runs")
    assert [(r["status"], r["error"]) for r in runs["runs"]] == [
        ("retrying", "timed out after 0.5 s"),
        ("succeeded", None),
    ]


async def test_a_cancelled_sync_handler_is_stopped_and_its_task_cancelled(
    spawn: Any, database_url: str, redis_url: str, prefix: str, tmp_path: Path, pool: asyncpg.Pool
) -> None:
    proc = start(spawn, database_url, redis_url, prefix, TASKMESH_LEASE_SECONDS="0.9")
    payload = {"dir": str(tmp_path), "seconds": 60}
    _, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sync_sleeps", "payload": payload})
    tid = body["task_id"]
    wait_until(lambda: stamp(tmp_path, "attempt1.start"))
    started = stamp(tmp_path, "attempt1.start")
    assert started is not None
    assert call(proc.port, "POST", f"/api/v1/tasks/{tid}/cancel")[0] == 202
    wait_until(lambda: task_status(proc.port, tid)["task"]["status"] == "cancelled", timeout=10)
    assert gone(started[0])  # its process was stopped when the heartbeat brought the cancel
    assert stamp(tmp_path, "attempt1.end") is None
    assert await pool.fetchval("SELECT count(*) FROM task_runs WHERE task_id = $1", tid) == 1
    [ended] = [e for e in proc.events() if e["event"] == "run_finished" and e.get("task_id") == tid]
    assert ended["outcome"] == "cancelled" and ended["duration_ms"] > 0, ended  # it ran until stopped


async def test_a_handler_process_that_dies_fails_that_run_and_is_replaced(
    spawn: Any, database_url: str, redis_url: str, prefix: str
) -> None:
    proc = start(spawn, database_url, redis_url, prefix)
    _, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sync_dies_first"})
    tid = body["task_id"]
    done = wait_until(
        lambda: task_status(proc.port, tid)["task"]["status"] == "completed" and task_status(proc.port, tid)
    )
    _, runs = call(proc.port, "GET", f"/api/v1/tasks/{tid}/runs")
    assert [(r["status"], r["error"]) for r in runs["runs"]] == [
        ("retrying", "handler process died (exit code 3)"),
        ("succeeded", None),
    ]
    assert done["latest_run"]["result"] == 2
    assert proc.alive()
