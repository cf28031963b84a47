"""Enqueue: idempotency, priority order, delays, Redis down at create time."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from taskmesh.runtime.clock import StoreClock
from taskmesh.services import delayed_mover, reconciler
from taskmesh.store import RedisStore, Stores
from taskmesh.store.keys import DELAYED_PRIORITY_SLOTS, Keys
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import parse_task_spec

pytestmark = pytest.mark.anyio


def spec(**fields: Any) -> Any:
    return parse_task_spec({"name": "t", **fields})


async def test_a_repeated_idempotency_key_returns_the_existing_task_and_writes_nothing(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    first = await tasks.enqueue(spec(dedup_key="k-1"))
    again = await tasks.enqueue(spec(dedup_key="k-1", priority=9))
    assert first.created and not again.created
    assert again.task_id == first.task_id
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1
    assert await pool.fetchval("SELECT count(*) FROM task_runs") == 0  # written at the first claim


async def test_a_repeated_key_of_a_finished_task_answers_its_status_and_does_not_queue_it_again(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    first = await tasks.enqueue(spec(dedup_key="done-1"))
    await pool.execute("UPDATE tasks SET status = 'completed' WHERE id = $1", first.task_id)
    again = await tasks.enqueue(spec(dedup_key="done-1"))
    assert (again.created, again.task_id, again.status) == (False, first.task_id, "completed")
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", first.task_id) == "completed"


async def test_fifty_concurrent_creates_with_one_key_make_exactly_one_task(tasks: Tasks, pool: asyncpg.Pool) -> None:
    ids: list[Any] = []

    async def create() -> None:
        ids.append((await tasks.enqueue(spec(dedup_key="same-key"))).task_id)

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(create)
    assert len(ids) == 50 and len(set(ids)) == 1
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1
    assert await pool.fetchval("SELECT count(*) FROM task_runs") == 0  # written at the first claim


async def test_a_new_task_has_a_queued_first_run_and_sits_in_the_ready_set(
    tasks: Tasks, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    created = await tasks.enqueue(spec(priority=7))
    task, run = await tasks.get(created.task_id)
    assert task["status"] == "queued" and task["type"] == "immediate" and task["priority"] == 7
    assert run is not None and run["attempt"] == 1 and run["status"] == "queued"
    assert await redis_client.zscore(keys.ready("default"), str(created.task_id)) is not None


async def test_the_pending_first_run_a_queued_task_shows_is_the_run_its_claim_writes(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    created = await tasks.enqueue(spec())
    assert await pool.fetchval("SELECT count(*) FROM task_runs") == 0
    _, pending = await tasks.get(created.task_id)
    assert pending is not None
    listed = await tasks.runs(created.task_id)
    assert [(r["id"], r["attempt"], r["status"], r["worker_id"]) for r in listed] == [
        (pending["id"], 1, "queued", None)
    ]
    [claimed] = await tasks.claim("default", [str(created.task_id)], "w-1", 30)
    assert str(claimed.run_id) == pending["id"]
    _, run = await tasks.get(created.task_id)
    assert run is not None and (run["id"], run["status"], run["worker_id"]) == (pending["id"], "running", "w-1")
    assert [r["id"] for r in await tasks.runs(created.task_id)] == [pending["id"]]


async def test_higher_priority_pops_first_and_fifo_holds_within_a_priority(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys
) -> None:
    order = [(1, "a"), (5, "b"), (1, "c"), (9, "d"), (5, "e"), (0, "f")]
    names = {}
    for priority, label in order:
        names[str((await tasks.enqueue(spec(priority=priority))).task_id)] = label
        await anyio.sleep(0.002)  # distinct milliseconds, so FIFO is observable
    popped = await tasks.redis.pop_ready("default", 10, 1)
    assert [names[i] for i in popped] == ["d", "b", "e", "a", "c", "f"]


async def test_a_pop_gives_each_id_with_its_own_score_best_first(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys
) -> None:
    async def stored(ids: list[str]) -> dict[str, float | None]:
        return {i: await redis_client.zscore(keys.ready("default"), i) for i in ids}

    made = [str((await tasks.enqueue(spec(priority=p))).task_id) for p in (1, 7, 4)]
    scores_before = await stored(made)
    ids, scores = await tasks.redis.pop_with_scores("default", 10, 1)
    assert ids == [made[1], made[2], made[0]]
    # the admission parks each id under the score it was popped with
    assert [float(s) for s in scores] == [scores_before[i] for i in ids]
    made = [str((await tasks.enqueue(spec(priority=p))).task_id) for p in (2, 3)]
    scores_before = await stored(made)
    assert await tasks.redis.pop_scored("default", 10, 1) == [(i, scores_before[i]) for i in (made[1], made[0])]


async def test_a_delayed_task_waits_in_the_delayed_set_until_due(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, store_clock: StoreClock
) -> None:
    created = await tasks.enqueue(spec(delay_seconds=60, priority=3))
    tid = str(created.task_id)
    task, _ = await tasks.get(created.task_id)
    assert task["type"] == "delayed"
    assert await redis_client.zscore(keys.delayed("default"), tid) is not None
    assert await delayed_mover.run_once(tasks.redis, ["default"]) == {"moved": 0}
    store_clock.offset = 59  # "now" a second before the due time: still not due
    assert await delayed_mover.run_once(tasks.redis, ["default"]) == {"moved": 0}
    assert await redis_client.zscore(keys.ready("default"), tid) is None
    store_clock.offset = 61
    assert await delayed_mover.run_once(tasks.redis, ["default"]) == {"moved": 1}
    assert await redis_client.zscore(keys.ready("default"), tid) is not None
    assert await redis_client.zscore(keys.delayed("default"), tid) is None


async def test_run_at_in_rfc3339_sets_the_due_time(tasks: Tasks, redis_client: aioredis.Redis, keys: Keys) -> None:
    due = datetime.now(UTC) + timedelta(hours=2)
    created = await tasks.enqueue(spec(run_at=due.isoformat().replace("+00:00", "Z")))
    score = await redis_client.zscore(keys.delayed("default"), str(created.task_id))
    assert score is not None and abs(score // DELAYED_PRIORITY_SLOTS / 1000 - due.timestamp()) < 0.002


async def test_a_delayed_mover_lock_held_elsewhere_skips_the_tick(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, store_clock: StoreClock
) -> None:
    await tasks.enqueue(spec(delay_seconds=60))
    await tasks.enqueue(spec(run_at=(datetime.now(UTC) + timedelta(seconds=60)).isoformat()))
    store_clock.offset = 61  # both are due
    lock = keys.lock("delayed_mover", "default")
    token = await tasks.redis.limits.try_lock(lock, 5000)
    assert token is not None
    assert await delayed_mover.run_once(tasks.redis, ["default"]) == {"moved": 0}
    await tasks.redis.limits.release_lock(lock, token)
    assert await delayed_mover.run_once(tasks.redis, ["default"]) == {"moved": 2}


async def test_a_create_succeeds_with_redis_down_and_the_task_is_pushed_once_redis_answers(
    stores: Stores, redis_client: aioredis.Redis, keys: Keys
) -> None:
    dead_redis = RedisStore.connect("redis://127.0.0.1:1/0", keys)  # nothing listens on port 1
    offline = Tasks(stores.pg, dead_redis)
    created = await offline.enqueue(spec(priority=4))
    await dead_redis.close()
    task, _ = await offline.get(created.task_id)
    assert task["status"] == "queued"
    assert await redis_client.zcard(keys.ready("default")) == 0

    online = Tasks(stores.pg, stores.redis)
    state = reconciler.State()
    # Young tasks are left alone: their own push may still be on its way.
    assert (await reconciler.sweep(online, ["default"], state, min_age=60, full=True))["repushed"] == 0
    # A minimum age of 0 stands for a sweep once the task is old enough (the age is PostgreSQL's).
    assert (await reconciler.sweep(online, ["default"], state, min_age=0, full=True))["repushed"] == 1
    assert await redis_client.zscore(keys.ready("default"), str(created.task_id)) is not None


async def test_enqueue_takes_the_handlers_default_retries_and_queue(tasks: Tasks) -> None:
    assert tasks.registry is not None

    @tasks.registry.task("mailer.send", queue="mail", max_retries=9)
    async def send(payload: Any) -> None:
        return None

    created = await tasks.enqueue(parse_task_spec({"name": "mailer.send"}))
    task, _ = await tasks.get(created.task_id)
    assert task["max_retries"] == 9 and task["queue_name"] == "mail"
    explicit = await tasks.enqueue(parse_task_spec({"name": "mailer.send", "queue_name": "default", "max_retries": 1}))
    task, _ = await tasks.get(explicit.task_id)
    assert task["max_retries"] == 1 and task["queue_name"] == "default"


async def test_claiming_one_id_twice_at_once_gives_it_to_exactly_one_claimer(tasks: Tasks) -> None:
    created = await tasks.enqueue(spec())
    tid = str(created.task_id)
    wins: list[int] = []

    async def claim(worker: str) -> None:
        wins.append(len(await tasks.claim("default", [tid, tid], worker, 30)))

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(claim, f"w{i}")
    assert sorted(wins) == [0] * 9 + [1]
    _, run = await tasks.get(created.task_id)
    assert run is not None and run["status"] == "running" and run["attempt"] == 1


async def test_the_delayed_task_is_not_claimable_early_through_the_instance(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ran_at: list[float] = []

    @registry.task("timed")
    async def timed(payload: Any) -> None:
        ran_at.append(time.time())

    async with start_instance() as inst:
        assert inst.state is not None and inst.state.tasks is not None
        t0 = time.time()
        await inst.state.tasks.enqueue(parse_task_spec({"name": "timed", "delay_seconds": 1.0}))
        with anyio.fail_after(10):
            while not ran_at:
                await anyio.sleep(0.02)
    assert ran_at[0] - t0 >= 1.0
