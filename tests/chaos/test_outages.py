"""Store outages with real processes: PostgreSQL down during a run, Redis down during an enqueue."""

from __future__ import annotations

import secrets
import signal
import time
from typing import Any

import asyncpg
import pytest

from taskmesh.dev.stack import EmbeddedPostgres, EmbeddedValkey
from tests.chaos.conftest import fresh_database
from tests.proc import Proc, call, spawn, task_status, wait_until

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = pytest.mark.anyio


def start(spawn: Any, url: str, valkey: EmbeddedValkey) -> Proc:
    proc: Proc = spawn(
        DATABASE_URL=url,
        REDIS_URL=valkey.url,
        TASKMESH_REDIS_PREFIX=f"outage{secrets.token_hex(3)}",
        TASKMESH_HANDLERS="tests.process_handlers",
        TASKMESH_LEASE_SECONDS="3",
        TASKMESH_RECLAIM_INTERVAL_SECONDS="0.5",
        TASKMESH_RECONCILE_INTERVAL_SECONDS="1",
    )
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=60, proc=proc)
    return proc


async def test_a_run_that_ends_while_postgres_is_down_is_written_once_it_is_back(
    owned_stores: tuple[EmbeddedPostgres, EmbeddedValkey], spawn: Any
) -> None:
    pg, valkey = owned_stores
    url = await fresh_database(pg, "outage")
    proc = start(spawn, url, valkey)
    _, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 1.5}})
    tid = body["task_id"]
    wait_until(lambda: task_status(proc.port, tid)["task"]["status"] == "running")
    pg.stop()
    try:
        assert wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 503, timeout=5)
        assert call(proc.port, "GET", "/healthz")[0] == 200
        time.sleep(3)  # the run ends meanwhile; its result waits in the committer
        assert proc.alive()
    finally:
        pg.start()
    done = wait_until(
        lambda: task_status(proc.port, tid)["task"]["status"] == "completed" and task_status(proc.port, tid)
    )
    assert done["latest_run"]["attempt"] == 1 and done["latest_run"]["result"] == "slept"
    conn = await asyncpg.connect(url)
    runs = await conn.fetch("SELECT attempt, status FROM task_runs WHERE task_id = $1", tid)
    await conn.close()
    assert [(r["attempt"], r["status"]) for r in runs] == [(1, "succeeded")]
    down = [e for e in proc.events() if e["event"] == "store_unavailable"]
    per_service: dict[str, int] = {}
    for e in down:
        per_service[e["service"]] = per_service.get(e["service"], 0) + 1
    assert per_service.get("committer") == 1, per_service  # once per outage, not once per retry
    assert all(n == 1 for n in per_service.values()), per_service


async def test_a_task_created_while_redis_is_down_runs_once_redis_is_back(
    owned_stores: tuple[EmbeddedPostgres, EmbeddedValkey], spawn: Any
) -> None:
    pg, valkey = owned_stores
    url = await fresh_database(pg, "outage")
    proc = start(spawn, url, valkey)
    valkey.stop_and_wait()
    try:
        assert wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 503, timeout=5)
        status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 0}})
        assert status == 201
        tid = body["task_id"]
        assert task_status(proc.port, tid)["task"]["status"] == "queued"
    finally:
        valkey.start()
    wait_until(lambda: task_status(proc.port, tid)["task"]["status"] == "completed", timeout=20)
    assert wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=5)


async def test_results_held_at_shutdown_while_postgres_is_down_are_logged_and_run_again_later(
    owned_stores: tuple[EmbeddedPostgres, EmbeddedValkey], spawn: Any
) -> None:
    pg, valkey = owned_stores
    url = await fresh_database(pg, "outage")
    proc = start(spawn, url, valkey)
    _, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 0.5}})
    tid = body["task_id"]
    wait_until(lambda: task_status(proc.port, tid)["task"]["status"] == "running")
    pg.stop()
    try:
        time.sleep(1.5)  # the run ends; its result waits in the committer
        t0 = time.monotonic()
        proc.signal(signal.SIGTERM)
        code = proc.wait(60)
        took = time.monotonic() - t0
    finally:
        pg.start()
    assert code == 0 and took < 30, (code, took)  # grace 30 s is not spent: nothing runs; the flush is bounded
    events = proc.events()
    unwritten = [e for e in events if e["event"] == "result_unwritten"]
    assert [e["task_id"] for e in unwritten] == [tid]
    assert any(e["event"] == "results_unwritten" and e["count"] == 1 for e in events)
    # The run was never recorded: its lease expires and another instance runs the task again.
    again = start(spawn, url, valkey)
    done = wait_until(
        lambda: task_status(again.port, tid)["task"]["status"] == "completed" and task_status(again.port, tid),
        timeout=30,
    )
    assert done["latest_run"]["attempt"] == 2
