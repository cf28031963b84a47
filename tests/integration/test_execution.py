"""Execution through a real instance: handlers, outcomes, retries, DLQ and replay."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from taskmesh.errors import NonRetryableError, Retry
from taskmesh.runtime.supervisor import Instance
from taskmesh.store import PgStore
from taskmesh.store.keys import Keys
from taskmesh.tasks.advertised import AdvertisedHandlers
from taskmesh.tasks.models import TaskContext
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import parse_task_spec
from tests.conftest import http, wait_for
from tests.proc import running
from tests.process_pool import handlers

pytestmark = pytest.mark.anyio


class Order(BaseModel):
    order_id: int


@dataclass
class Resize:
    width: int
    height: int


def facade(inst: Instance) -> Tasks:
    assert inst.state is not None and inst.state.tasks is not None
    return inst.state.tasks


async def enqueue(inst: Instance, **fields: Any) -> str:
    return str((await facade(inst).enqueue(parse_task_spec(fields))).task_id)


async def settled(inst: Instance, task_id: str, status: str, timeout: float = 15) -> dict[str, Any]:
    import uuid

    async def check() -> Any:
        task, run = await facade(inst).get(uuid.UUID(task_id))
        return {"task": task, "latest_run": run} if task["status"] == status else None

    result: dict[str, Any] = await wait_for(check, timeout)
    return result


async def runs_of(pool: asyncpg.Pool, task_id: str) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM task_runs WHERE task_id = $1 ORDER BY attempt", task_id)


async def test_sync_handlers_run_in_a_worker_thread_and_async_ones_on_the_loop(
    start_instance: Any, registry: Registry
) -> None:
    seen: dict[str, bool] = {}

    @registry.task("sync.job")
    def sync_job(payload: dict[str, Any]) -> str:
        seen["sync_on_main"] = threading.current_thread() is threading.main_thread()
        return "sync done"

    @registry.task("async.job")
    async def async_job(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        seen["async_on_main"] = threading.current_thread() is threading.main_thread()
        return {"attempt": ctx.attempt, "name": ctx.name}

    async with start_instance(worker_concurrency=2) as inst:
        a = await enqueue(inst, name="sync.job")
        b = await enqueue(inst, name="async.job")
        ra = await settled(inst, a, "completed")
        rb = await settled(inst, b, "completed")
    assert seen == {"sync_on_main": False, "async_on_main": True}
    assert ra["latest_run"]["result"] == "sync done"
    assert rb["latest_run"]["result"] == {"attempt": 1, "name": "async.job"}


async def test_a_failing_task_retries_with_backoff_then_succeeds(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    @registry.task("flaky")
    async def flaky(payload: Any, ctx: TaskContext) -> str:
        if ctx.attempt == 1:
            raise ConnectionError("upstream refused")
        return "ok"

    async with start_instance() as inst:
        tid = await enqueue(inst, name="flaky", max_retries=3)
        done = await settled(inst, tid, "completed")
    runs = await runs_of(pool, tid)
    assert [r["status"] for r in runs] == ["retrying", "succeeded"]
    assert runs[0]["error"] == "ConnectionError: upstream refused"
    wait = (runs[0]["next_retry_at"] - runs[0]["finished_at"]).total_seconds()
    assert 0.5 <= wait <= 1.5  # min(2**0, 3600) s after the first failure, with jitter x0.5-1.5
    assert runs[1]["claimed_at"] >= runs[0]["next_retry_at"]
    assert done["task"]["retries"] == 1 and done["latest_run"]["next_retry_at"] is None


async def test_exhausted_retries_dead_letter_the_task_and_replay_starts_a_fresh_cycle(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    calls: list[int] = []

    @registry.task("doomed")
    async def doomed(payload: Any, ctx: TaskContext) -> str:
        calls.append(ctx.attempt)
        if ctx.priority % 2:
            raise RuntimeError("odd priority")
        return "fine"

    async with start_instance() as inst, http(inst) as client:
        tid = await enqueue(inst, name="doomed", priority=3, max_retries=1)
        failed = await settled(inst, tid, "failed")
        assert failed["latest_run"]["status"] == "failed" and failed["latest_run"]["attempt"] == 2
        assert await redis_client.zrange(keys.dlq("default"), 0, -1) == [tid]
        dlq = (await client.get("/api/v1/queues/default/dlq?count=10")).json()
        assert [t["id"] for t in dlq["tasks"]] == [tid] and dlq["count"] == 1

        # Without override_priority the priority stays, and the failure recurs.
        r = await client.post("/api/v1/queues/default/dlq/replay", json={"count": 5})
        assert r.status_code == 200 and r.json()["replayed"] == [tid]
        again = await settled(inst, tid, "failed")
        assert again["task"]["priority"] == 3 and again["latest_run"]["attempt"] == 4

        r = await client.post("/api/v1/queues/default/dlq/replay", json={"count": 1, "override_priority": 4})
        assert r.json()["replayed"] == [tid]
        done = await settled(inst, tid, "completed")
        assert done["task"]["priority"] == 4 and done["task"]["retries"] == 0
        assert await redis_client.zcard(keys.dlq("default")) == 0
        empty = (await client.get("/api/v1/queues/default/dlq")).json()
        assert empty["tasks"] == []
    assert calls == [1, 2, 3, 4, 5]
    statuses = [r["status"] for r in await runs_of(pool, tid)]
    assert statuses == ["retrying", "failed", "retrying", "failed", "succeeded"]


class Blind(AdvertisedHandlers):
    """Reads no advertisements (as a version before them)."""

    async def refresh(self, pg: PgStore) -> None:
        return None


async def test_non_retryable_outcomes_fail_at_once(start_instance: Any, registry: Registry) -> None:
    @registry.task("refuses")
    async def refuses(payload: Any) -> None:
        raise NonRetryableError("invoice 7 does not exist")

    @registry.task("typed")
    async def typed(payload: Order) -> int:
        return payload.order_id

    async with start_instance() as inst:
        a = await enqueue(inst, name="refuses", max_retries=5)
        b = await enqueue(inst, name="nobody.handles.this", max_retries=5)
        # Enqueued where the handler is not registered, by a client of a version that reads no
        # advertised payload schema (an enqueue here is refused: test_payload_models, and so is
        # one through an up-to-date client: test_advertised_handlers).
        elsewhere = Tasks(facade(inst).pg, facade(inst).redis, registry=None, advertised=Blind())
        c = str(
            (
                await elsewhere.enqueue(
                    parse_task_spec({"name": "typed", "payload": {"order_id": "seven"}, "max_retries": 5})
                )
            ).task_id
        )
        d = await enqueue(inst, name="typed", payload={"order_id": 7})
        ra = await settled(inst, a, "failed")
        rb = await settled(inst, b, "failed")
        rc = await settled(inst, c, "failed")
        rd = await settled(inst, d, "completed")
    assert ra["latest_run"]["error"] == "NonRetryableError: invoice 7 does not exist"
    assert rb["latest_run"]["error"] == "no handler registered for task name 'nobody.handles.this'"
    assert rc["latest_run"]["error"].startswith("payload does not fit the handler: 1 validation error for Order")
    for r in (ra, rb, rc):
        assert r["latest_run"]["attempt"] == 1 and r["task"]["retries"] == 0
    assert rd["latest_run"]["result"] == 7


async def test_a_dataclass_payload_is_decoded_for_the_handler(start_instance: Any, registry: Registry) -> None:
    @registry.task("resize")
    def resize(payload: Resize) -> int:
        return payload.width * payload.height

    async with start_instance() as inst:
        tid = await enqueue(inst, name="resize", payload={"width": 3, "height": 4})
        done = await settled(inst, tid, "completed")
    assert done["latest_run"]["result"] == 12


async def test_a_run_over_its_timeout_is_cancelled_and_counts_as_a_failure(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    finished: list[str] = []

    @registry.task("slow.async", timeout=0.2)
    async def slow_async(payload: Any) -> None:
        await anyio.sleep(30)
        finished.append("async")

    # Importable by name, so it runs in a handler process (a closure would run in a thread,
    # which no timeout can stop); it tells from there whether it was stopped.
    registry.task("slow.sync", timeout=0.2)(handlers.sleep_then_mark)
    seconds = 1.0

    async with start_instance(worker_concurrency=2) as inst:
        a = await enqueue(inst, name="slow.async", max_retries=0)
        b = await enqueue(inst, name="slow.sync", max_retries=1, payload={"dir": str(tmp_path), "seconds": seconds})
        ra = await settled(inst, a, "failed")
        await wait_for(lambda: _first_run_ended(pool, b), timeout=10)
        pid_file = tmp_path / "pid.1"
        pid = int(pid_file.read_text())
        assert pid != os.getpid()  # it ran in a handler process
        assert not running(pid), "the handler process outlived its run's timeout"
        # Past the end of the handler's sleep: a handler left running would have marked it by now.
        await anyio.sleep(max(0.0, pid_file.stat().st_mtime + seconds + 0.3 - time.time()))
        assert not (tmp_path / "done.1").exists(), "the timed-out handler ran to its end"
    assert ra["latest_run"]["error"] == "timed out after 0.2 s"
    runs = await runs_of(pool, b)
    assert runs[0]["error"] == "timed out after 0.2 s" and runs[0]["status"] == "retrying"
    assert "async" not in finished


async def _first_run_ended(pool: asyncpg.Pool, task_id: str) -> bool:
    runs = await runs_of(pool, task_id)
    return bool(runs) and runs[0]["status"] != "running" and runs[0]["status"] != "queued"


async def test_a_handler_may_ask_for_a_retry_after_its_own_delay(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    @registry.task("later")
    async def later(payload: Any, ctx: TaskContext) -> str:
        if ctx.attempt == 1:
            raise Retry("rate limited", delay_seconds=0.3)
        return "ok"

    async with start_instance() as inst:
        tid = await enqueue(inst, name="later")
        await settled(inst, tid, "completed")
    runs = await runs_of(pool, tid)
    assert runs[0]["error"] == "Retry: rate limited"
    assert abs((runs[0]["next_retry_at"] - runs[0]["finished_at"]).total_seconds() - 0.3) < 0.01


async def test_with_one_executor_tasks_run_in_priority_order(start_instance: Any, registry: Registry) -> None:
    order: list[int] = []
    gate = anyio.Event()

    @registry.task("ordered")
    async def ordered(payload: dict[str, int]) -> None:
        if payload["p"] == -1:
            await gate.wait()
            return
        order.append(payload["p"])

    async with start_instance(worker_concurrency=1) as inst:
        blocker = await enqueue(inst, name="ordered", payload={"p": -1}, priority=1000)
        await wait_for(lambda: _is_running(inst, blocker))
        ids = [await enqueue(inst, name="ordered", payload={"p": p}, priority=p) for p in (1, 50, 7, 50, 900, 0)]
        gate.set()
        for tid in ids:
            await settled(inst, tid, "completed")
    assert order == [900, 50, 50, 7, 1, 0]


async def _is_running(inst: Instance, task_id: str) -> bool:
    import uuid

    task, _ = await facade(inst).get(uuid.UUID(task_id))
    return bool(task["status"] == "running")


async def test_metrics_count_created_tasks_and_finished_runs(start_instance: Any, registry: Registry) -> None:
    @registry.task("counted")
    async def counted(payload: Any) -> None:
        return None

    async with start_instance() as inst, http(inst) as client:
        tid = await enqueue(inst, name="counted")
        await settled(inst, tid, "completed")
        text = (await client.get("/metrics")).text
    assert 'taskmesh_tasks_created_total{queue="default"} 1.0' in text
    assert 'taskmesh_runs_finished_total{outcome="succeeded",queue="default",task_name="counted"} 1.0' in text
    assert 'taskmesh_run_duration_seconds_count{queue="default",task_name="counted"} 1.0' in text
    assert 'taskmesh_queue_depth{queue="default",state="ready"} 0.0' in text


async def test_a_handlers_own_timeout_error_is_an_ordinary_failure_not_a_deadline(
    start_instance: Any, registry: Registry
) -> None:
    @registry.task("own.timeout")
    async def own_timeout(payload: Any) -> None:
        raise TimeoutError("socket read timed out")

    @registry.task("own.timeout.with.limit", timeout=30)
    async def own_timeout_with_limit(payload: Any) -> None:
        raise TimeoutError("socket read timed out")

    async with start_instance() as inst:
        a = await enqueue(inst, name="own.timeout", max_retries=0)
        b = await enqueue(inst, name="own.timeout.with.limit", max_retries=0)
        ra = await settled(inst, a, "failed")
        rb = await settled(inst, b, "failed")
    assert ra["latest_run"]["error"] == "TimeoutError: socket read timed out"
    assert rb["latest_run"]["error"] == "TimeoutError: socket read timed out"
