"""Leases, heartbeats, reclaim and fencing against real PostgreSQL and Redis."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from taskmesh.observability.metrics import Metrics
from taskmesh.services import heartbeat, reclaimer
from taskmesh.store.keys import DLQ_MIRROR_MAX, Keys
from taskmesh.tasks.models import Outcome, RunResult
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import parse_task_spec

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
async def postgres_up_for_a_lease(pool: asyncpg.Pool) -> None:
    """The reclaimer spares everything for one lease after a PostgreSQL start (a fresh embedded one)."""
    uptime = await pool.fetchval("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")
    if uptime < 1.5:
        await anyio.sleep(1.5 - float(uptime))


async def claimed(tasks: Tasks, worker: str, lease: float = 30, **fields: Any) -> Any:
    created = await tasks.enqueue(parse_task_spec({"name": "t", **fields}))
    [task] = await tasks.claim("default", [str(created.task_id)], worker, lease)
    return task


async def expire(pool: asyncpg.Pool, task_id: uuid.UUID) -> None:
    await pool.execute(
        "UPDATE task_runs SET lease_expires_at = now() - interval '1 second' WHERE task_id = $1 AND status = 'running'",
        task_id,
    )


async def beat(tasks: Tasks, worker: str, lease: float = 30, held: tuple[Any, ...] = ()) -> list[uuid.UUID]:
    """One heartbeat of ``worker`` holding the runs of ``held`` (claimed tasks)."""
    return await heartbeat.run_once(
        tasks.pg, worker, {"default": 1}, lease_seconds=lease, held=[t.run_id for t in held]
    )


async def workers(tasks: Tasks) -> list[Any]:
    return list(await tasks.pg.workers.list(100))


async def test_an_expired_run_of_a_dead_worker_is_retried_with_backoff(
    tasks: Tasks, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    task = await claimed(tasks, "dead-worker", max_retries=2)
    await expire(pool, task.task_id)
    assert await reclaimer.run_once(tasks, lease_seconds=1) == {"queued": 1}
    row = await pool.fetchrow("SELECT status, retries, run_at FROM tasks WHERE id = $1", task.task_id)
    run = await pool.fetchrow("SELECT * FROM task_runs WHERE id = $1", task.run_id)
    assert row is not None and run is not None
    assert row["status"] == "queued" and row["retries"] == 1
    assert run["status"] == "retrying" and run["error"] == "lease expired"
    wait = (run["next_retry_at"] - run["finished_at"]).total_seconds()
    assert 0.5 <= wait <= 1.5  # the first backoff, 1 s, with jitter x0.5-1.5
    assert await redis_client.zscore(keys.delayed("default"), str(task.task_id)) is not None
    assert await reclaimer.run_once(tasks, lease_seconds=1) == {}


async def test_a_run_that_keeps_killing_its_worker_ends_in_the_dlq(
    tasks: Tasks, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    task = await claimed(tasks, "dead-worker", max_retries=0)
    await expire(pool, task.task_id)
    assert await reclaimer.run_once(tasks, lease_seconds=1) == {"failed": 1}
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", task.task_id) == "failed"
    assert await redis_client.zrange(keys.dlq("default"), 0, -1) == [str(task.task_id)]


async def test_a_live_worker_keeps_the_runs_it_holds_and_loses_those_it_does_not(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    held = await claimed(tasks, "live-worker", lease=1)
    lost = await claimed(tasks, "live-worker", lease=1)  # claimed, then dropped by a bug
    await beat(tasks, "live-worker", lease=30, held=(held,))
    lease = await pool.fetchval("SELECT lease_expires_at - now() FROM task_runs WHERE id = $1", held.run_id)
    assert lease.total_seconds() > 29
    await expire(pool, lost.task_id)
    assert await reclaimer.run_once(tasks, lease_seconds=1) == {"queued": 1}
    assert await pool.fetchval("SELECT status FROM task_runs WHERE id = $1", held.run_id) == "running"
    assert await pool.fetchval("SELECT error FROM task_runs WHERE id = $1", lost.run_id) == "lease expired"


async def test_the_heartbeat_registers_the_worker_and_extends_only_its_own_leases(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    mine = await claimed(tasks, "w-1", lease=1)
    other = await claimed(tasks, "w-2", lease=1)
    await beat(tasks, "w-1", lease=60, held=(mine, other))  # another worker's run is never extended
    leases = {
        r["task_id"]: r["left"].total_seconds()
        for r in await pool.fetch("SELECT task_id, lease_expires_at - now() AS left FROM task_runs")
    }
    assert leases[mine.task_id] > 59 and leases[other.task_id] < 2
    assert [(w["id"], w["state"], w["in_flight"], w["queues"]) for w in await workers(tasks)] == [
        ("w-1", "running", 1, '{"default": 1}')
    ]


async def test_the_heartbeat_skips_a_run_whose_result_is_being_written_and_waits_for_no_lock(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    """The committer's write locks its runs in another order than the heartbeat's: waiting made them deadlock."""
    writing, other = await claimed(tasks, "w-1", lease=1), await claimed(tasks, "w-1", lease=1)
    async with pool.acquire() as committer, committer.transaction():
        await committer.execute("UPDATE task_runs SET error = 'writing' WHERE id = $1", writing.run_id)
        with anyio.fail_after(5):  # waiting for the lock would block until the transaction ends
            await beat(tasks, "w-1", lease=60, held=(writing, other))
    leases = {
        r["id"]: r["left"].total_seconds()
        for r in await pool.fetch("SELECT id, lease_expires_at - now() AS left FROM task_runs")
    }
    assert leases[other.run_id] > 59 and leases[writing.run_id] < 2
    await beat(tasks, "w-1", lease=60, held=(writing, other))  # the lock gone, the next beat extends it
    assert await pool.fetchval("SELECT lease_expires_at - now() FROM task_runs WHERE id = $1", writing.run_id) > (
        datetime.timedelta(seconds=59)
    )


async def test_a_cancel_request_reaches_the_worker_through_its_heartbeat(tasks: Tasks) -> None:
    task = await claimed(tasks, "w-1")
    assert await beat(tasks, "w-1", held=(task,)) == []
    done = await tasks.cancel(task.task_id)
    assert (done.status, done.previous) == ("running", "running")
    assert await beat(tasks, "w-1", held=(task,)) == [task.task_id]


async def test_concurrent_reclaimers_end_each_expired_run_exactly_once(tasks: Tasks, pool: asyncpg.Pool) -> None:
    for i in range(40):
        task = await claimed(tasks, f"dead-{i % 4}", max_retries=3)
        await expire(pool, task.task_id)
    totals: list[int] = []

    async def reclaim() -> None:
        totals.append(sum((await reclaimer.run_once(tasks, lease_seconds=1)).values()))

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(reclaim)
    assert sum(totals) == 40
    assert await pool.fetchval("SELECT count(*) FROM task_runs WHERE status = 'retrying'") == 40
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE retries = 1 AND status = 'queued'") == 40


async def test_a_late_result_of_a_reclaimed_run_is_dropped_and_the_new_attempt_wins(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    tasks.metrics = Metrics()
    zombie = await claimed(tasks, "frozen", max_retries=3)
    await expire(pool, zombie.task_id)
    await reclaimer.run_once(tasks, lease_seconds=1)
    await pool.execute("UPDATE tasks SET run_at = now() WHERE id = $1", zombie.task_id)  # skip the backoff
    [second] = await tasks.claim("default", [str(zombie.task_id)], "healthy", 30)
    assert second.attempt == 2
    assert await tasks.finish([RunResult(second, Outcome.SUCCEEDED, result='"second"')], "healthy") == 1
    assert await tasks.finish([RunResult(zombie, Outcome.FAILED, error="boom")], "frozen") == 0
    task, run = await tasks.get(zombie.task_id)
    assert task["status"] == "completed" and run is not None and run["result"] == "second"
    assert tasks.metrics.late_results._value.get() == 1


async def test_a_worker_silent_for_three_leases_is_shown_lost(tasks: Tasks, pool: asyncpg.Pool) -> None:
    await beat(tasks, "gone")
    await beat(tasks, "here")
    await pool.execute("UPDATE workers SET heartbeat_at = now() - interval '100 seconds' WHERE id = 'gone'")
    await reclaimer.run_once(tasks, lease_seconds=1)
    states = {w["id"]: w["state"] for w in await workers(tasks)}
    assert states == {"gone": "lost", "here": "running"}
    await tasks.pg.workers.deregister("here")
    assert {w["id"]: w["state"] for w in await workers(tasks)}["here"] == "stopped"


async def test_the_reconciler_rewrites_a_dlq_mirror_that_drifted_from_postgres(
    tasks: Tasks, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    from taskmesh.services import reconciler

    dead = [await claimed(tasks, "dead-worker", max_retries=0) for _ in range(3)]
    for task in dead:
        await expire(pool, task.task_id)
    await reclaimer.run_once(tasks, lease_seconds=1)
    expected = [
        str(r["id"]) for r in await pool.fetch("SELECT id FROM tasks WHERE status = 'failed' ORDER BY updated_at, id")
    ]
    await redis_client.delete(keys.dlq("default"))
    await redis_client.zadd(keys.dlq("default"), {"not-a-failed-task": 1, expected[0]: 2})
    await redis_client.rpush(keys.legacy_dlq("default"), *expected)  # the list of earlier versions
    assert await reconciler.repair_dlq(tasks, "default") is True
    assert await redis_client.zrange(keys.dlq("default"), 0, -1) == expected
    assert await redis_client.exists(keys.legacy_dlq("default")) == 0
    assert await reconciler.repair_dlq(tasks, "default") is False


async def test_the_dlq_mirror_keeps_the_oldest_ten_thousand_at_a_cost_independent_of_its_size(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys
) -> None:
    old = [f"old-{i:05d}" for i in range(DLQ_MIRROR_MAX)]
    await tasks.redis.dead_letter("default", old)
    await anyio.sleep(0.01)  # a later millisecond: newer than every one before
    await tasks.redis.dead_letter("default", ["newer-1", "newer-2"])
    assert await redis_client.zcard(keys.dlq("default")) == DLQ_MIRROR_MAX
    assert await redis_client.zscore(keys.dlq("default"), "newer-1") is None
    await tasks.redis.replay("default", [("old-00000", 0), ("old-00001", 0)])
    await tasks.redis.forget("default", "old-00002")
    assert await redis_client.zcard(keys.dlq("default")) == DLQ_MIRROR_MAX - 3
