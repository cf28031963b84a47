"""Due times: one future bound for ``run_at`` and ``delay_seconds``, any past time means now, and rows no one validated.

A ``run_at`` in the past, however old (year 1, with any offset), means "now", as in every
peer: the task is ready at once and stored due at its creation. One more than
``max_delay_seconds`` ahead (a setting, default a year) is refused like a ``delay_seconds``
over it: a 422 naming ``run_at`` with the bound in its message, from the API and from the
Python client alike, and nothing is written. A task whose ``run_at`` is ``-infinity`` (a row
taskmesh did not write, inserted by hand) is claimed and run by a live instance, which keeps
serving.
"""

from __future__ import annotations

import functools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from taskmesh.clients.client import Client
from taskmesh.errors import InvalidTaskError
from taskmesh.store.keys import Keys, ready_score
from taskmesh.tasks.registry import Registry
from tests.conftest import REDIS_MODE, http, wait_for
from tests.integration.test_api_bad_input import assert_nothing_written, assert_problem, bad_task

pytestmark = pytest.mark.anyio

AHEAD = "must be at most 365 days ahead (max_delay_seconds, as delay_seconds); any past time means now"
TASKS = "/api/v1/tasks"


def at(delta: timedelta) -> str:
    """Now plus ``delta`` as RFC 3339 text in UTC."""
    return (datetime.now(UTC) + delta).isoformat().replace("+00:00", "Z")


def too_far_ahead_cases() -> list[Any]:
    year = timedelta(days=365)
    return [
        bad_task(
            "run_at year 9999 (parked for 8,000 years)",
            {"name": "x", "run_at": "9999-12-31T23:59:59Z"},
            "run_at",
            AHEAD,
        ),
        bad_task(
            "run_at year 9999 with a negative offset",
            {"name": "x", "run_at": "9999-12-31T23:59:59-01:00"},
            "run_at",
            AHEAD,
        ),
        bad_task(
            "run_at a year and a day ahead", {"name": "x", "run_at": at(year + timedelta(days=1))}, "run_at", AHEAD
        ),
        bad_task(
            "type delayed, run_at too far ahead",
            {"name": "x", "type": "delayed", "run_at": "2999-01-01T00:00:00Z"},
            "run_at",
            AHEAD,
        ),
    ]


async def test_run_at_beyond_the_future_bound_is_refused_with_the_bound_and_nothing_is_written(
    start_instance: Any, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        for bad in too_far_ahead_cases():
            r = await client.request(bad.method, bad.path, **bad.request)
            assert_problem(r, bad)
            await assert_nothing_written(pool, redis_client, keys, bad.case)
        r = await client.post(
            f"{TASKS}:batch", json={"tasks": [{"name": "x", "run_at": "9999-12-31T23:59:59Z"}], "atomic": True}
        )
        assert r.status_code == 422, r.text
        assert r.json()["errors"] == [{"field": "tasks[0].run_at", "message": AHEAD}]
        await assert_nothing_written(pool, redis_client, keys, "atomic batch")


PAST = [
    "0001-01-01T00:00:00Z",  # was refused, and before that stored as -infinity
    "0001-01-01T00:00:00+01:00",  # Python cannot shift it to UTC
    "1999-12-31T23:59:59-05:00",
    at(-timedelta(days=366)),  # a year and a day ago: a client computing run_at from an old record
    at(-timedelta(days=3650)),
    at(-timedelta(seconds=1)),
]


async def test_any_past_run_at_means_now_however_old(
    start_instance: Any, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        made = [await client.post(TASKS, json={"name": "x", "run_at": run_at}) for run_at in PAST]
        batch = await client.post(f"{TASKS}:batch", json={"tasks": [{"name": "x", "run_at": r} for r in PAST]})
    assert [m.status_code for m in made] == [201] * len(PAST), [m.text for m in made]
    assert batch.status_code == 200 and batch.json()["created"] == len(PAST), batch.text
    ids = [m.json()["task_id"] for m in made] + [r["task_id"] for r in batch.json()["results"]]
    assert sorted(await redis_client.zrange(keys.ready("default"), 0, -1)) == sorted(ids)
    assert await redis_client.zcard(keys.delayed("default")) == 0
    # Stored due at its creation: the task waited no year, and sorts as new.
    late = await pool.fetchval("SELECT count(*) FROM tasks WHERE run_at < created_at")
    assert late == 0 and await pool.fetchval("SELECT count(*) FROM tasks") == 2 * len(PAST)


async def test_run_at_within_a_year_ahead_is_accepted_and_delayed(
    start_instance: Any, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        ahead = await client.post(TASKS, json={"name": "x", "run_at": at(timedelta(days=364))})
        most = await client.post(TASKS, json={"name": "x", "delay_seconds": 31_536_000})
    assert (ahead.status_code, most.status_code) == (201, 201), (ahead.text, most.text)
    delayed = await redis_client.zrange(keys.delayed("default"), 0, -1)
    assert sorted(delayed) == sorted([ahead.json()["task_id"], most.json()["task_id"]])
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 2


async def test_the_max_delay_seconds_setting_moves_the_future_bound_of_both_fields(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    async with start_instance(workers_enabled=False, max_delay_seconds=3600) as inst, http(inst) as client:
        long_delay = await client.post(TASKS, json={"name": "x", "delay_seconds": 3601})
        late = await client.post(TASKS, json={"name": "x", "run_at": at(timedelta(hours=2))})
        in_batch = await client.post(f"{TASKS}:batch", json={"tasks": [{"name": "x", "delay_seconds": 7200}]})
        fits = await client.post(TASKS, json={"name": "x", "run_at": at(timedelta(minutes=30))})
    assert (long_delay.status_code, long_delay.json()["detail"]) == (
        422,
        "delay_seconds: Input should be less than or equal to 3600",
    )
    assert (late.status_code, late.json()["detail"]) == (
        422,
        "run_at: must be at most 3600 seconds ahead (max_delay_seconds, as delay_seconds); any past time means now",
    )
    assert in_batch.json()["results"][0]["errors"] == [
        {"field": "tasks[0].delay_seconds", "message": "Input should be less than or equal to 3600"}
    ]
    assert fits.status_code == 201
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1


async def test_the_client_refuses_run_at_too_far_ahead_with_the_same_message_and_takes_any_past_one(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    async with Client(
        database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=Registry()
    ) as client:
        for run_at in ("9999-12-31T23:59:59Z", datetime(9999, 12, 31, tzinfo=UTC)):
            with pytest.raises(InvalidTaskError) as caught:
                await client.enqueue("x", run_at=run_at)
            assert (caught.value.field, caught.value.message) == ("run_at", AHEAD)
        with pytest.raises(InvalidTaskError) as caught:
            await client.enqueue_many([{"name": "x"}, {"name": "x", "run_at": "2999-01-01T00:00:00Z"}])
        assert (caught.value.field, caught.value.message) == ("tasks[1].run_at", AHEAD)
        await assert_nothing_written(pool, redis_client, keys, "client")
        old = await client.enqueue("x", run_at=datetime(2001, 1, 1, tzinfo=UTC))
        await client.enqueue_many([{"name": "x", "run_at": "0001-01-01T00:00:00+01:00"}])
    assert await redis_client.zscore(keys.ready("default"), str(old)) is not None
    assert await redis_client.zcard(keys.ready("default")) == 2
    async with Client(
        database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, max_delay_seconds=60
    ) as short:
        with pytest.raises(InvalidTaskError) as caught:
            await short.enqueue("x", delay_seconds=61)
    assert (caught.value.field, caught.value.message) == ("delay_seconds", "Input should be less than or equal to 60")


async def test_hand_inserted_tasks_due_at_minus_infinity_are_run_and_the_instance_keeps_serving(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    ran: list[Any] = []

    @registry.task("legacy.job")
    async def job(payload: Any) -> str:
        ran.append(payload)
        return "done"

    # One id is pushed by hand; the other is left for the reconciler to find and push.
    pushed, found = uuid.uuid4(), uuid.uuid4()
    # The reconciler leaves a row alone for one interval, which gives the sampler (every 0.1 s) a
    # two seconds to meet the rows before any of them runs, even on a loaded machine.
    async with start_instance(metrics_sample_seconds=0.1, reconcile_interval_seconds=2.0) as inst, http(inst) as client:
        for task_id, k in ((pushed, 1), (found, 2)):
            await pool.execute(
                """INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at)
                   VALUES ($1, 'legacy.job', 'immediate', 'default', 0, $2::text::jsonb, 3, 'queued', '-infinity')""",
                task_id,
                f'{{"k": {k}}}',
            )
            await pool.execute("INSERT INTO task_runs (task_id, attempt, status) VALUES ($1, 1, 'queued')", task_id)
        # The sampler meets the rows before the fetcher does.
        await wait_for(lambda: _sampled_age(client), timeout=5)
        await redis_client.zadd(keys.ready("default"), {str(pushed): ready_score(0, 0)})

        async def completed(task_id: uuid.UUID) -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get(f"{TASKS}/{task_id}")).json()
            return body if body["task"]["status"] == "completed" else None

        for task_id in (pushed, found):
            body = await wait_for(functools.partial(completed, task_id), timeout=15)
            assert body["latest_run"]["status"] == "succeeded"
            assert body["task"]["run_at"] == "-infinity"
        assert sorted(p["k"] for p in ran) == [1, 2]
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        metrics = (await client.get("/metrics")).text
        assert inst.state is not None and inst.state.services.down() == {}
        assert not [line for line in metrics.splitlines() if line.startswith("taskmesh_service_restarts_total{")]
        error_ticks = [
            line
            for line in metrics.splitlines()
            if line.startswith("taskmesh_service_ticks_total{") and 'outcome="error"' in line
        ]
        assert error_ticks == []
    assert inst.failed is None


async def _sampled_age(client: httpx.AsyncClient) -> bool:
    """Whether the sampler has reported an age for the default queue's oldest ready task (the -infinity one)."""
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith('taskmesh_queue_oldest_ready_age_seconds{queue="default"}'):
            return float(line.rsplit(" ", 1)[1]) > 0
    return False
