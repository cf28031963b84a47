"""A service's bug, or a broken migration, against real processes.

Before, an unexpected exception in any service (say the sampler) made the
instance exit 1 within seconds, with no drain, no hand-back, its runs left
``running`` with live leases and its worker row ``running``; and a failing
migration was logged once as ``store_unavailable`` and retried for ever while
``/readyz`` said both stores were down.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import anyio
import asyncpg
import pytest

from tests.conftest import scratch_database
from tests.proc import Proc, call, spawn, stores_env, task_status, wait_until

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("redis_client")]


def start(spawn: Any, database_url: str, redis_url: str, prefix: str, **extra: str) -> Proc:
    env = stores_env(database_url, redis_url, prefix, **extra)
    env["TASKMESH_HANDLERS"] = "tests.broken_services"
    proc: Proc = spawn(**env)
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] in (200, 503) and proc.alive(), proc=proc)
    return proc


def _created(proc: Proc, body: dict[str, Any]) -> dict[str, Any] | None:
    status, answer = call(proc.port, "POST", "/api/v1/tasks", body)
    return answer if status == 201 else None


def metric(proc: Proc, line_start: str) -> float | None:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_crashing_optional_service_is_restarted_and_the_instance_keeps_working(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    proc = start(
        spawn,
        database_url,
        redis_url,
        prefix,
        BREAK_SERVICE="sampler",
        TASKMESH_METRICS_SAMPLE_SECONDS="0.2",
        TASKMESH_SERVICE_RESTARTS="3",
    )
    # Within seconds the sampler crashes past its budget (3 restarts) and stays down.
    wait_until(
        lambda: call(proc.port, "GET", "/readyz")[1].get("services") == {"sampler": "failed"}, timeout=30, proc=proc
    )
    status, ready = call(proc.port, "GET", "/readyz")
    assert status == 200 and ready["ready"] is True  # an optional service down does not take the API out
    assert metric(proc, 'taskmesh_service_restarts_total{service="sampler"}') == 4
    assert metric(proc, 'taskmesh_service_up{service="sampler"}') == 0
    # The instance still takes and runs tasks.
    _, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 0}})
    wait_until(lambda: task_status(proc.port, body["task_id"])["task"]["status"] == "completed", proc=proc)
    crashes = [e for e in proc.events() if e["event"] == "service_crashed"]
    assert len(crashes) == 4 and all(e["service"] == "sampler" for e in crashes)
    assert "RuntimeError: injected bug in the sampler" in crashes[0]["exception"]  # with its traceback
    assert [e["event"] for e in proc.events() if e["event"] == "service_failed"] == ["service_failed"]
    code = proc.wait(0.1) if not proc.alive() else None
    assert code is None
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0


async def test_a_critical_service_past_its_budget_drains_hands_back_and_exits_1(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    proc = start(
        spawn,
        database_url,
        redis_url,
        prefix,
        BREAK_SERVICE="reclaimer",
        TASKMESH_RECLAIM_INTERVAL_SECONDS="1",  # crashes at about 1, 2.5 and 4.5 s: time to create the task
        TASKMESH_SERVICE_RESTARTS="2",
        TASKMESH_SHUTDOWN_GRACE_SECONDS="1",
    )
    # The API may still be connecting (503) when start() returns: create as soon as it takes the task.
    created = wait_until(lambda: _created(proc, {"name": "sleepy", "payload": {"seconds": 60}}), proc=proc)
    tid = created["task_id"]
    t0 = time.monotonic()
    code = proc.wait(60)
    took = time.monotonic() - t0
    assert code == 1, proc.output()[-2000:]
    assert "taskmesh: error: service 'reclaimer' crashed 3 times within its restart budget" in proc.output()
    assert took < 30
    # Graceful: the run was handed back (no retry spent), the worker row says stopped.
    row = await pool.fetchrow("SELECT status, retries FROM tasks WHERE id = $1", tid)
    assert row is not None
    assert (row["status"], row["retries"]) == ("queued", 0)
    run = await pool.fetchrow("SELECT status, error FROM task_runs WHERE task_id = $1 AND attempt = 1", tid)
    assert run is not None
    assert run["error"] == "interrupted: instance shut down before the run finished"
    assert await pool.fetchval("SELECT array_agg(state) FROM workers") == ["stopped"]
    events = [e["event"] for e in proc.events()]
    assert "runs_handed_back" in events and "instance_stopped" in events


async def test_a_migration_that_cannot_succeed_stops_the_start_with_its_error(
    spawn: Any, store_urls: tuple[str, str], redis_url: str, prefix: str
) -> None:
    async with scratch_database(store_urls[0], "tm_badmig") as url:
        conn = await asyncpg.connect(url)
        # A table in the way of migration 0004: "already exists" will not go away by retrying.
        await conn.execute("CREATE TABLE schedules (something int)")
        await conn.close()
        env = stores_env(url, redis_url, prefix)
        proc: Proc = spawn(**env)
        code = await anyio.to_thread.run_sync(proc.wait, 30)
        assert code == 1, proc.output()[-2000:]
        out = proc.output()
        assert (
            'taskmesh: error: migration 0004_schedules failed: DuplicateTableError: relation "schedules" already exists'
            in out
        )
        events = proc.events()
        assert [e["event"] for e in events if e["event"] == "migration_failed"] == ["migration_failed"]
        assert not any(e["event"] == "store_unavailable" for e in events)  # not an outage
        conn = await asyncpg.connect(url)
        applied = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")]
        await conn.close()
        assert applied == [1, 2, 3]  # the failed one left nothing half-applied
    assert sys.executable  # the spawned process used this interpreter
