"""Recovery from what Redis loses or holds that taskmesh did not write.

Real PostgreSQL, real Redis, real instances: in-process (``start_instance``) where the
reconciler and the delayed mover are what is under test, real processes (``spawn``) where
the question is whether the process survives and what it logs.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from taskmesh.runtime.supervisor import Instance
from taskmesh.store.keys import PRIORITY_MAX, PRIORITY_STEP, Keys, ready_score
from taskmesh.store.redis_clients import open_client
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec
from tests.conftest import REDIS_MODE, http, wait_for
from tests.proc import Proc, call, spawn, stores_env, task_status

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = pytest.mark.anyio

StartInstance = Callable[..., contextlib.AbstractAsyncContextManager[Instance]]


@contextlib.asynccontextmanager
async def raw_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A client that reads replies as bytes: foreign members are not UTF-8."""
    client = cast(aioredis.Redis, open_client(redis_url, REDIS_MODE))
    try:
        yield client
    finally:
        await client.aclose()


def band(score: float) -> int:
    """The priority a ready score encodes (keys.ready_score)."""
    return PRIORITY_MAX - int(score) // PRIORITY_STEP


# -- 11a: the sweep walks the whole backlog --------------------------------------------------


async def test_the_sweep_repairs_missing_ids_beyond_the_oldest_five_thousand(
    start_instance: StartInstance, tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, pool: asyncpg.Pool
) -> None:
    # The instance serves "stash" but runs no workers: nothing drains it, its reconciler sweeps it.
    async with start_instance(queue_names=["stash"], workers_enabled=False, reconcile_interval_seconds=1):
        old = await tasks.enqueue_many([TaskSpec(name="stashed", queue_name="stash") for _ in range(5000)])
        await anyio.sleep(0.05)  # the newer tasks get a strictly later run_at
        new = await tasks.enqueue_many([TaskSpec(name="stashed", queue_name="stash") for _ in range(7005)])
        assert await redis_client.zcard(keys.ready("stash")) == 12_005
        # What Redis running out of memory did: the newest pushes are gone, the oldest 5,000 are there.
        assert await redis_client.zrem(keys.ready("stash"), *[str(e.task_id) for e in new]) == 7005
        lost_at = time.monotonic()

        missing = 7005
        while missing and time.monotonic() - lost_at < 10:
            await anyio.sleep(0.2)
            present = await redis_client.zmscore(keys.ready("stash"), [str(e.task_id) for e in new])
            missing = sum(1 for s in present if s is None)
        assert missing == 0, f"{missing} of 7005 lost ids still missing from Redis 10 s after the loss"
        took = time.monotonic() - lost_at
    queued = {str(r["id"]) for r in await pool.fetch("SELECT id FROM tasks WHERE status = 'queued'")}
    in_redis = set(await redis_client.zrange(keys.ready("stash"), 0, -1))
    assert queued == in_redis == {str(e.task_id) for e in old + new}
    print(f"\n7,005 lost ids behind 5,000 present ones repaired {took:.1f} s after the loss (sweep every 1 s)")


# -- 11b: a delayed id carries its priority ------------------------------------------------------


async def test_due_delayed_tasks_keep_their_priority_when_every_other_key_of_the_queue_is_lost(
    start_instance: StartInstance, redis_client: aioredis.Redis, keys: Keys, prefix: str
) -> None:
    async with start_instance(queue_names=["prio"], workers_enabled=False) as inst, http(inst) as client:
        # The low priority is due first: moved at priority 0, FIFO would put it ahead.
        low = (
            await client.post(
                "/api/v1/tasks", json={"name": "later", "queue_name": "prio", "priority": 3, "delay_seconds": 1.5}
            )
        ).json()["task_id"]
        high = (
            await client.post(
                "/api/v1/tasks", json={"name": "later", "queue_name": "prio", "priority": 7, "delay_seconds": 1.7}
            )
        ).json()["task_id"]
        queue_keys = [k async for k in redis_client.scan_iter(match=f"{prefix}:{{prio}}:*")]
        lost = [k for k in queue_keys if k != keys.delayed("prio")]
        if lost:
            await redis_client.delete(*lost)
        assert await redis_client.zcard(keys.delayed("prio")) == 2, "the tasks were moved before the loss"

        async def both_ready() -> list[str]:
            order = [str(m) for m in await redis_client.zrange(keys.ready("prio"), 0, -1)]
            return order if len(order) == 2 else []

        order = await wait_for(both_ready, timeout=5)
        scores = await redis_client.zmscore(keys.ready("prio"), order)
    assert [(t, None if s is None else band(s)) for t, s in zip(order, scores, strict=True)] == [(high, 7), (low, 3)]
    assert await redis_client.zcard(keys.delayed("prio")) == 0


async def test_a_delayed_entry_written_before_0_2_moves_with_the_priority_of_its_hash(
    start_instance: StartInstance, redis_client: aioredis.Redis, keys: Keys
) -> None:
    due_now, due_later = str(uuid.uuid4()), str(uuid.uuid4())
    now_ms = time.time_ns() // 1_000_000
    later_ms = now_ms + 3_600_000
    async with start_instance(queue_names=["legacy"], workers_enabled=False):
        # As 0.1 wrote them: score = bare due ms, priority in the hash.
        await redis_client.hset(keys.priorities("legacy"), mapping={due_now: 9, due_later: 5})
        await redis_client.zadd(keys.delayed("legacy"), {due_now: now_ms - 1000, due_later: later_ms})

        async def moved() -> float | None:
            score: float | None = await redis_client.zscore(keys.ready("legacy"), due_now)
            return score

        score = await wait_for(moved, timeout=5)
        assert score == ready_score(9, now_ms - 1000)
        assert band(score) == 9

        async def rewritten() -> float | None:
            # The one not due yet is rewritten in the current encoding (due ms * 1024 + priority).
            later: float | None = await redis_client.zscore(keys.delayed("legacy"), due_later)
            return later if later is not None and later > later_ms else None

        assert await wait_for(rewritten, timeout=5) == later_ms * 1024 + 5
        assert await redis_client.hgetall(keys.priorities("legacy")) == {}


# -- 12: foreign bytes in Redis --------------------------------------------------------------------

FOREIGN = [b"\xff", b"hello"]


def foreign_key(prefix: str, queue: str) -> str:
    """Where foreign members are set aside: ``{prefix}:{q}:foreign``, as the issue names it."""
    return f"{prefix}:{{{queue}}}:foreign"


def start_process(spawn: Any, database_url: str, redis_url: str, prefix: str) -> Proc:
    proc: Proc = spawn(**stores_env(database_url, redis_url, prefix, TASKMESH_RECONCILE_INTERVAL_SECONDS="1"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.alive():
        try:
            if call(proc.port, "GET", "/readyz")[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the instance did not become ready; its output:\n{proc.output()[-3000:]}")


def fate(proc: Proc) -> str:
    """How the process ended (it is given 5 s to), with the tail of its output."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    code = proc.popen.poll()
    state = "still runs" if code is None else f"exited with {code}"
    return f"the instance {state}; its output:\n{proc.output()[-3000:]}"


async def keeps_serving(proc: Proc, seconds: float) -> None:
    """``/readyz`` answers 200 every 0.2 s for ``seconds``, and the process stays alive."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            status: int | None = call(proc.port, "GET", "/readyz")[0]
        except OSError:
            status = None
        assert status == 200 and proc.alive(), f"/readyz answered {status}; {fate(proc)}"
        await anyio.sleep(0.2)


async def completes_a_task(proc: Proc) -> None:
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sleepy"})
    assert status == 201, body
    tid: str = body["task_id"]

    async def completed() -> bool:
        assert proc.alive(), fate(proc)
        return bool(task_status(proc.port, tid)["task"]["status"] == "completed")

    await wait_for(completed, timeout=10)


@pytest.mark.usefixtures("pool", "redis_client")  # empty tables; the prefix's keys deleted after
async def test_foreign_members_of_a_ready_set_are_set_aside_and_the_instance_keeps_serving(
    spawn: Any, database_url: str, redis_url: str, prefix: str, keys: Keys
) -> None:
    proc = start_process(spawn, database_url, redis_url, prefix)
    async with raw_redis(redis_url) as r:
        await r.zadd(keys.ready("default"), dict.fromkeys(FOREIGN, 0))

        async def popped() -> bool:
            assert proc.alive(), fate(proc)
            return await r.zcard(keys.ready("default")) == 0

        await wait_for(popped, timeout=5)
        await keeps_serving(proc, 3)
        await completes_a_task(proc)
        assert sorted(await r.lrange(foreign_key(prefix, "default"), 0, -1)) == sorted(FOREIGN)
    said = [e for e in proc.events() if e["event"] == "redis_foreign_member"]
    assert [(e["key"], e["kept_in"]) for e in said] == [(keys.ready("default"), foreign_key(prefix, "default"))]


@pytest.mark.usefixtures("pool", "redis_client")
async def test_foreign_members_of_a_dlq_list_are_set_aside_and_the_instance_keeps_serving(
    spawn: Any, database_url: str, redis_url: str, prefix: str, keys: Keys
) -> None:
    proc = start_process(spawn, database_url, redis_url, prefix)
    # A task no handler runs is dead-lettered at once: the mirror has one real id.
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "nobody_runs_this"})
    assert status == 201, body
    failed: str = body["task_id"]
    async with raw_redis(redis_url) as r:

        async def mirrored() -> bool:
            return await r.zrange(keys.dlq("default"), 0, -1) == [failed.encode()]

        await wait_for(mirrored, timeout=10)
        await r.zadd(keys.dlq("default"), dict.fromkeys(FOREIGN, 1))

        async def repaired() -> bool:
            assert proc.alive(), fate(proc)
            return await r.zrange(keys.dlq("default"), 0, -1) == [failed.encode()]

        await wait_for(repaired, timeout=5)  # the next sweep, 1 s apart
        await keeps_serving(proc, 3)  # three more sweeps
        await completes_a_task(proc)
        assert sorted(await r.lrange(foreign_key(prefix, "default"), 0, -1)) == sorted(FOREIGN)
        assert await r.zrange(keys.dlq("default"), 0, -1) == [failed.encode()]
    said = [e for e in proc.events() if e["event"] == "redis_foreign_member"]
    assert [(e["key"], e["kept_in"]) for e in said] == [(keys.dlq("default"), foreign_key(prefix, "default"))]


# -- 13: one reconciler lock per queue -------------------------------------------------------------


async def test_an_instance_repairs_its_queue_while_another_instance_sweeps_a_different_one(
    start_instance: StartInstance, registry: Registry, redis_client: aioredis.Redis, keys: Keys
) -> None:
    ran: list[str] = []

    @registry.task("b_job")
    async def b_job(payload: Any) -> None:
        ran.append("b_job")

    async with start_instance(queue_names=["a"], reconcile_interval_seconds=1):
        # A's reconciler has swept at least once: on the old code it holds the one lock from now on,
        # taking it again as soon as it expires.
        await anyio.sleep(1.5)
        async with start_instance(queue_names=["b"], reconcile_interval_seconds=1) as b, http(b) as client:
            # A task no handler runs is dead-lettered at once; then its DLQ mirror is lost.
            r = await client.post("/api/v1/tasks", json={"name": "nobody_runs_this", "queue_name": "b"})
            failed = r.json()["task_id"]

            async def mirrored() -> bool:
                return bool(await redis_client.zrange(keys.dlq("b"), 0, -1) == [failed])

            await wait_for(mirrored, timeout=5)
            await redis_client.delete(keys.dlq("b"))
            r = await client.post("/api/v1/tasks", json={"name": "b_job", "queue_name": "b", "delay_seconds": 1})
            tid = r.json()["task_id"]
            # The push is lost before the task is due: only PostgreSQL knows the task.
            assert await redis_client.zrem(keys.delayed("b"), tid) == 1
            lost_at = time.monotonic()

            async def completed() -> str | None:
                status: str = (await client.get(f"/api/v1/tasks/{tid}")).json()["task"]["status"]
                return status if status == "completed" else None

            # Unchanged for one sweep interval, then B's next sweep finds it: about 2 s, never 4 minutes.
            await wait_for(completed, timeout=6, interval=0.1)
            took = time.monotonic() - lost_at
            await wait_for(mirrored, timeout=2)  # rewritten by the same sweep
    assert ran == ["b_job"]
    print(f"\nlost push in queue b repaired and run {took:.1f} s after the loss (sweep every 1 s)")
