"""Cancellation, the workers listing, long runs under short leases, and Redis losing its data."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from tests.conftest import POOLER, http, wait_for

pytestmark = pytest.mark.anyio


async def status_of(client: Any, task_id: str) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get(f"/api/v1/tasks/{task_id}")).json()
    return body


async def test_cancelling_a_queued_task_means_it_never_runs(
    start_instance: Any, registry: Registry, redis_client: aioredis.Redis, keys: Keys
) -> None:
    ran: list[str] = []

    @registry.task("never")
    async def never(payload: Any) -> None:
        ran.append("ran")

    async with start_instance() as inst, http(inst) as client:
        r = await client.post("/api/v1/tasks", json={"name": "never", "delay_seconds": 1})
        tid = r.json()["task_id"]
        pending = (await status_of(client, tid))["latest_run"]
        await anyio.sleep(0.05)  # a later instant: the run's record must keep the pending run's
        r = await client.post(f"/api/v1/tasks/{tid}/cancel")
        assert (r.status_code, r.json()) == (200, {"task_id": tid, "status": "cancelled"})
        assert await redis_client.zscore(keys.delayed("default"), tid) is None
        await anyio.sleep(1.5)
        body = await status_of(client, tid)
        assert body["task"]["status"] == "cancelled"
        assert (body["latest_run"]["status"], body["latest_run"]["error"]) == ("failed", "cancelled")
        # the pending run the task showed, now written: same id, same creation time
        assert (body["latest_run"]["id"], body["latest_run"]["created_at"]) == (pending["id"], pending["created_at"])
        r = await client.post(f"/api/v1/tasks/{tid}/cancel")
        assert r.status_code == 409
        assert r.json()["detail"] == f"task {tid} is cancelled; there is nothing to cancel"
    assert ran == []


async def test_cancelling_a_running_task_cancels_its_handler_and_does_not_retry(
    start_instance: Any, registry: Registry
) -> None:
    started = anyio.Event()

    @registry.task("long")
    async def long(payload: Any) -> None:
        started.set()
        await anyio.sleep(60)

    async with start_instance(lease_seconds=0.6) as inst, http(inst) as client:
        r = await client.post("/api/v1/tasks", json={"name": "long", "max_retries": 5})
        tid = r.json()["task_id"]
        with anyio.fail_after(10):
            await started.wait()
        r = await client.post(f"/api/v1/tasks/{tid}/cancel")
        assert (r.status_code, r.json()) == (202, {"task_id": tid, "status": "running", "cancel_requested": True})

        async def cancelled() -> Any:
            body = await status_of(client, tid)
            return body if body["task"]["status"] == "cancelled" else None

        body = await wait_for(cancelled, timeout=10)
        runs = (await client.get(f"/api/v1/tasks/{tid}/runs")).json()["runs"]
    assert body["task"]["retries"] == 0
    assert [(r["attempt"], r["status"], r["error"]) for r in runs] == [(1, "failed", "cancelled")]


async def test_cancel_answers_404_for_an_unknown_task_and_409_for_a_finished_one(
    start_instance: Any, registry: Registry
) -> None:
    @registry.task("quick")
    async def quick(payload: Any) -> None:
        return None

    async with start_instance() as inst, http(inst) as client:
        r = await client.post(f"/api/v1/tasks/{uuid.UUID(int=1)}/cancel")
        assert r.status_code == 404
        assert r.json()["detail"] == f"no task has id {uuid.UUID(int=1)}"
        tid = (await client.post("/api/v1/tasks", json={"name": "quick"})).json()["task_id"]

        async def completed() -> bool:
            return bool((await status_of(client, tid))["task"]["status"] == "completed")

        await wait_for(completed)
        r = await client.post(f"/api/v1/tasks/{tid}/cancel")
        assert r.status_code == 409
        assert r.json()["detail"] == f"task {tid} is completed; there is nothing to cancel"
        r = await client.post("/api/v1/tasks/nope/cancel")
        assert (r.status_code, r.json()["detail"]) == (422, "task_id: must be a UUID")


async def test_a_task_running_three_leases_long_keeps_its_lease_and_runs_once(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    # Through PgBouncer (the pooler suite) every statement is two round trips and the machine runs
    # two test processes: a 0.8 s lease left a heartbeat no room, so the lease is longer there.
    lease = 0.8 if POOLER == "none" else 2.0

    @registry.task("marathon")
    async def marathon(payload: Any) -> str:
        await anyio.sleep(3 * lease)
        return "done"

    async with start_instance(lease_seconds=lease) as inst, http(inst) as client:
        tid = (await client.post("/api/v1/tasks", json={"name": "marathon"})).json()["task_id"]

        async def completed() -> bool:
            return bool((await status_of(client, tid))["task"]["status"] == "completed")

        await wait_for(completed, timeout=15)
        workers = (await client.get("/api/v1/workers")).json()["workers"]
    runs = await pool.fetch("SELECT attempt, status FROM task_runs WHERE task_id = $1", tid)
    assert [(r["attempt"], r["status"]) for r in runs] == [(1, "succeeded")]
    assert [(w["id"], w["state"]) for w in workers] == [(inst.worker_id, "running")]
    # After the instance stopped, it shows as stopped.
    assert await pool.fetchval("SELECT state FROM workers WHERE id = $1", inst.worker_id) == "stopped"


async def test_after_redis_loses_its_data_queued_tasks_are_pushed_again_and_run(
    start_instance: Any, registry: Registry, redis_client: aioredis.Redis, keys: Keys, prefix: str, pool: asyncpg.Pool
) -> None:
    gate = anyio.Event()
    done: list[str] = []

    @registry.task("gated")
    async def gated(payload: dict[str, str]) -> None:
        if payload["id"] == "blocker":
            await gate.wait()
        done.append(payload["id"])

    async with start_instance(worker_concurrency=1) as inst, http(inst) as client:
        await client.post("/api/v1/tasks", json={"name": "gated", "payload": {"id": "blocker"}})
        await wait_for(lambda: pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'running'"))
        for i in range(5):
            await client.post(
                "/api/v1/tasks", json={"name": "gated", "payload": {"id": f"t{i}"}, "delay_seconds": i % 2}
            )
        # What a FLUSHALL does to this instance's keys (the machine's Redis is shared, so only ours go).
        our_keys = [k async for k in redis_client.scan_iter(match=f"{prefix}:*")]
        await redis_client.delete(*our_keys)
        assert await redis_client.zcard(keys.ready("default")) == 0
        await wait_for(lambda: redis_client.exists(keys.marker("default")), timeout=5)
        assert await redis_client.zcard(keys.ready("default")) + await redis_client.zcard(keys.delayed("default")) == 5
        gate.set()
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 6 FROM tasks WHERE status = 'completed'"), timeout=10)
    assert sorted(done) == ["blocker", "t0", "t1", "t2", "t3", "t4"]
