"""Crash safety with real processes: kill -9, a poison task, a frozen worker, signals."""

from __future__ import annotations

import signal
import time
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from taskmesh.store.keys import Keys
from tests.proc import Proc, call, create, spawn, stores_env, task_status, wait_until

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("redis_client")]

FAST = {"TASKMESH_LEASE_SECONDS": "1.5", "TASKMESH_RECLAIM_INTERVAL_SECONDS": "0.3"}


def start(spawn: Any, database_url: str, redis_url: str, prefix: str, **extra: str) -> Proc:
    proc: Proc = spawn(**stores_env(database_url, redis_url, prefix, **{**FAST, **extra}))
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, proc=proc)
    return proc


async def runs(pool: asyncpg.Pool, task_id: str) -> list[tuple[int, str, str | None]]:
    rows = await pool.fetch("SELECT attempt, status, error FROM task_runs WHERE task_id = $1 ORDER BY attempt", task_id)
    return [(r["attempt"], r["status"], r["error"]) for r in rows]


async def test_the_task_of_a_worker_killed_with_sigkill_runs_again_elsewhere(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    a = start(spawn, database_url, redis_url, prefix)
    tid = create(a, {"name": "slow_first", "payload": {"seconds": 60}})
    wait_until(lambda: task_status(a.port, tid)["task"]["status"] == "running")
    b = start(spawn, database_url, redis_url, prefix)
    killed_at = time.monotonic()
    a.signal(signal.SIGKILL)
    done = wait_until(lambda: task_status(b.port, tid)["task"]["status"] == "completed" and task_status(b.port, tid))
    took = time.monotonic() - killed_at
    print(f"\nreclaim after kill -9: task completed {took:.1f} s after the kill (lease 1.5 s)")
    assert done["latest_run"]["result"]["pid"] == b.pid
    assert await runs(pool, tid) == [(1, "retrying", "lease expired"), (2, "succeeded", None)]
    # lease (1.5 s) + worker silence check + reclaim tick (0.3 s) + backoff (1 s) + mover: seconds, not minutes
    assert took < 20


async def test_a_task_that_kills_its_worker_every_time_ends_in_the_dlq(
    spawn: Any,
    database_url: str,
    redis_url: str,
    prefix: str,
    pool: asyncpg.Pool,
    redis_client: aioredis.Redis,
    keys: Keys,
) -> None:
    procs = [start(spawn, database_url, redis_url, prefix)]
    # Due half a second later, so that the instance answers the create before the task kills it.
    tid = create(procs[0], {"name": "poison", "max_retries": 1, "delay_seconds": 0.5})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if await pool.fetchval("SELECT status FROM tasks WHERE id = $1", tid) == "failed":
            break
        if not procs[-1].alive():
            procs.append(start(spawn, database_url, redis_url, prefix))
        time.sleep(0.1)
    assert await runs(pool, tid) == [(1, "retrying", "lease expired"), (2, "failed", "lease expired")]
    assert await redis_client.zrange(keys.dlq("default"), 0, -1) == [tid]
    print(f"\npoison task: failed after 2 attempts, {len(procs)} instances started, {len(procs) - 1} killed by it")


async def test_a_frozen_workers_late_result_is_rejected_and_the_second_attempt_stands(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    a = start(spawn, database_url, redis_url, prefix)
    tid = create(a, {"name": "slow_first", "payload": {"seconds": 3}})
    wait_until(lambda: task_status(a.port, tid)["task"]["status"] == "running")
    a.signal(signal.SIGSTOP)
    b = start(spawn, database_url, redis_url, prefix)
    wait_until(lambda: task_status(b.port, tid)["task"]["status"] == "completed")
    a.signal(signal.SIGCONT)
    wait_until(lambda: any(e["event"] == "late_result_dropped" for e in a.events()), timeout=15)
    done = task_status(b.port, tid)
    assert done["latest_run"]["attempt"] == 2 and done["latest_run"]["result"]["pid"] == b.pid
    assert await runs(pool, tid) == [(1, "retrying", "lease expired"), (2, "succeeded", None)]
    [late] = [e for e in a.events() if e["event"] == "late_result_dropped"]
    assert (late["task_id"], late["attempt"], late["outcome"]) == (tid, 1, "succeeded")


async def test_sigterm_hands_back_an_unfinished_run_which_completes_on_another_instance(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    a = start(spawn, database_url, redis_url, prefix, TASKMESH_SHUTDOWN_GRACE_SECONDS="0.5")
    quick = create(a, {"name": "sleepy", "payload": {"seconds": 0.2}})
    slow = create(a, {"name": "slow_first", "payload": {"seconds": 60}, "max_retries": 0})
    wait_until(lambda: task_status(a.port, slow)["task"]["status"] == "running")
    a.signal(signal.SIGTERM)
    assert a.wait(10) == 0
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", quick) == "completed"
    b = start(spawn, database_url, redis_url, prefix)
    done = wait_until(lambda: task_status(b.port, slow)["task"]["status"] == "completed" and task_status(b.port, slow))
    assert done["task"]["retries"] == 0  # handing back spent no retry, so max_retries=0 still let it run again
    assert await runs(pool, slow) == [
        (1, "retrying", "interrupted: instance shut down before the run finished"),
        (2, "succeeded", None),
    ]


async def test_a_second_signal_ends_the_grace_period_at_once_and_still_hands_back(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    a = start(spawn, database_url, redis_url, prefix)  # default grace: 30 s
    tid = create(a, {"name": "sleepy", "payload": {"seconds": 60}})
    wait_until(lambda: task_status(a.port, tid)["task"]["status"] == "running")
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    wait_until(lambda: any(e["event"] == "draining" for e in a.events()), timeout=5)
    a.signal(signal.SIGTERM)
    assert a.wait(10) == 0, a.output()
    assert time.monotonic() - t0 < 10
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", tid) == "queued"
    assert await pool.fetchval("SELECT state FROM workers") == "stopped"
    events = [e["event"] for e in a.events()]
    assert "shutdown_forced" in events and "runs_handed_back" in events
