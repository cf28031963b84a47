"""An async handler that blocks the event loop must not make the instance deaf.

Before, a handler calling ``time.sleep`` inside ``async def`` made SIGTERM, and
the second SIGTERM, do nothing; only SIGKILL ended the instance. Now the
blocked loop is detected and named, and SIGTERM ends the instance within the
grace period plus a few seconds: its runs are handed back, due two seconds
later, so another instance finishes them.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import asyncpg
import pytest

from tests.proc import Proc, call, spawn, stores_env, task_status, wait_until

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("redis_client")]

GRACE = 2.0


def start(spawn: Any, database_url: str, redis_url: str, prefix: str) -> Proc:
    proc: Proc = spawn(
        **stores_env(
            database_url,
            redis_url,
            prefix,
            TASKMESH_SHUTDOWN_GRACE_SECONDS=str(GRACE),
            TASKMESH_RECONCILE_INTERVAL_SECONDS="0.5",
        )
    )
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, proc=proc)
    return proc


def create_blocking_task(proc: Proc) -> dict[str, Any]:
    """Create a task whose handler blocks the loop for 120 s; it runs half a second later.

    Delayed so that the instance answers the request first: an immediate task may start, and
    block the loop, before the answer is written, and the request would time out.
    """
    status, body = call(
        proc.port, "POST", "/api/v1/tasks", {"name": "blocks_loop", "payload": {"seconds": 120}, "delay_seconds": 0.5}
    )
    assert status == 201 and isinstance(body, dict), body
    return body


async def block_the_loop(proc: Proc, pool: asyncpg.Pool) -> str:
    """Create a task whose handler blocks ``proc``'s loop, wait until it runs and the loop counts as blocked."""
    tid = str(create_blocking_task(proc)["task_id"])
    # The loop is blocked, so the instance's API cannot answer: ask PostgreSQL.
    for _ in range(100):
        if await pool.fetchval("SELECT status FROM tasks WHERE id = $1", tid) == "running":
            break
        time.sleep(0.05)
    time.sleep(1.5)  # past the detector's threshold (1 s)
    return tid


async def test_sigterm_ends_an_instance_whose_loop_a_handler_blocks_and_its_run_finishes_elsewhere(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    a = start(spawn, database_url, redis_url, prefix)
    tid = await block_the_loop(a, pool)
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    code = a.wait(GRACE + 15)
    took = time.monotonic() - t0
    assert code == 1, a.output()[-2000:]  # the emergency exit, not a clean one
    assert took < GRACE + 3 + 3, took  # grace + the watchdog's margin + the hand-back
    events = a.events()
    blocked = [e for e in events if e["event"] == "event_loop_blocked"]
    assert len(blocked) == 1 and blocked[0]["task_id"] == tid and blocked[0]["task_name"] == "blocks_loop"
    assert any("time.sleep" in frame for frame in blocked[0]["stack"]) or "blocks_loop" in str(blocked[0]["stack"])
    assert [e["reason"] for e in events if e["event"] == "shutdown_emergency"] == ["deadline"]
    assert [e["count"] for e in events if e["event"] == "emergency_hand_back"] == [1]
    row = await pool.fetchrow("SELECT status, retries FROM tasks WHERE id = $1", tid)
    assert row is not None
    assert (row["status"], row["retries"]) == ("queued", 0)  # handed back, no retry spent
    b = start(spawn, database_url, redis_url, prefix)
    done = wait_until(lambda: task_status(b.port, tid)["task"]["status"] == "completed" and task_status(b.port, tid))
    assert done["latest_run"]["attempt"] == 2 and done["latest_run"]["result"]["pid"] == b.pid


async def test_a_second_sigterm_ends_a_blocked_instance_at_once(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    a = start(spawn, database_url, redis_url, prefix)
    tid = await block_the_loop(a, pool)
    a.signal(signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    assert a.wait(15) == 1
    assert time.monotonic() - t0 < 3
    assert [e["reason"] for e in a.events() if e["event"] == "shutdown_emergency"] == ["second_signal"]
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", tid) == "queued"
