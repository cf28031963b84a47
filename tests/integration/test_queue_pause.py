"""Pausing a queue: no instance claims its tasks until it is resumed.

The pause is a row in PostgreSQL that the claim statement itself reads, so it
holds on every instance from its commit on and survives restarts; enqueue goes
on, running runs finish, and a resume is seen within a second. Every bad
request gets an exact problem and pauses nothing.
"""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec
from tests.conftest import http, wait_for
from tests.integration.test_api_bad_input import QUEUE_PATTERN, Bad, assert_problem, invalid, malformed
from tests.integration.test_metrics_exposed import sample

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"
PAUSE = "/api/v1/queues/default/pause"
RESUME = "/api/v1/queues/default/resume"
STILL_SECONDS = 1.5
"""How long a paused queue is watched for a claim that must not happen."""


def register(registry: Registry) -> tuple[list[str], anyio.Event]:
    """``pause.job`` records its task id; ``pause.slow`` runs until the returned event is set."""
    ran: list[str] = []
    release = anyio.Event()

    @registry.task("pause.job")
    async def job(payload: Any, ctx: Any) -> None:
        ran.append(str(ctx.task_id))

    @registry.task("pause.slow")
    async def slow(payload: Any) -> str:
        await release.wait()
        return "finished"

    return ran, release


async def status_of(client: httpx.AsyncClient, task_id: str) -> str:
    body: dict[str, Any] = (await client.get(f"{TASKS}/{task_id}")).json()
    return str(body["task"]["status"])


async def create(client: httpx.AsyncClient, name: str, n: int = 1) -> list[str]:
    ids = []
    for _ in range(n):
        r = await client.post(TASKS, json={"name": name})
        assert r.status_code == 201, r.text
        ids.append(r.json()["task_id"])
    return ids


async def test_a_pause_holds_on_every_instance_running_runs_finish_and_a_resume_restarts_claims(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ran, release = register(registry)
    async with (
        start_instance(metrics_sample_seconds=0.1, worker_concurrency=4) as a,
        start_instance(metrics_sample_seconds=0.1, worker_concurrency=4) as b,
        http(a) as ca,
        http(b) as cb,
    ):
        [slow] = await create(ca, "pause.slow")
        await wait_for(lambda: _is(ca, slow, "running"))
        r = await ca.post(PAUSE, json={"reason": "deploy of the reports service"})
        assert r.status_code == 200, r.text
        paused = r.json()
        assert paused["queue"] == "default" and paused["paused"] is True
        assert paused["reason"] == "deploy of the reports service" and paused["paused_at"]
        again = await cb.post(PAUSE)  # idempotent: the first paused_at and reason stay
        assert again.json() == paused
        queued = await create(cb, "pause.job", 20)  # enqueue goes on, through either instance
        await anyio.sleep(STILL_SECONDS)
        assert ran == []
        rows = await pool.fetch("SELECT status, count(*) AS n FROM tasks WHERE name = 'pause.job' GROUP BY 1")
        statuses = {r["status"]: r["n"] for r in rows}
        assert statuses == {"queued": 20}
        release.set()  # the run that started before the pause finishes
        await wait_for(lambda: _is(ca, slow, "completed"))
        metrics = await wait_for(lambda: _metric_is(cb, 1.0))
        assert sample(metrics, "taskmesh_queue_paused", queue="default") == 1.0
        workers = (await ca.get("/api/v1/workers")).json()
        assert workers["paused_queues"] == [paused]
        resumed = await cb.post(RESUME)
        assert resumed.status_code == 200, resumed.text
        assert resumed.json() == {"queue": "default", "paused": False, "paused_at": None, "reason": None}
        await wait_for(lambda: _all_completed(ca, queued), timeout=10)
        assert sorted(ran) == sorted(queued)  # each once
        await wait_for(lambda: _metric_is(ca, 0.0))
        assert (await ca.get("/api/v1/workers")).json()["paused_queues"] == []


async def test_a_pause_survives_a_restart_of_every_instance(start_instance: Any, registry: Registry) -> None:
    ran, _ = register(registry)
    async with start_instance() as first, http(first) as client:
        assert (await client.post(PAUSE)).status_code == 200
    async with start_instance() as second, http(second) as client:
        [task_id] = await create(client, "pause.job")
        await anyio.sleep(STILL_SECONDS)
        assert ran == [] and await status_of(client, task_id) == "queued"
        assert (await client.post(RESUME)).status_code == 200
        await wait_for(lambda: _is(client, task_id, "completed"))
    assert ran == [task_id]


async def test_ids_popped_from_a_paused_queue_go_back_to_ready_and_are_claimed_after_the_resume(
    tasks: Tasks, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    [created] = await tasks.enqueue_many([TaskSpec(name="pause.job")])
    await tasks.pg.queues.pause("default", None)
    ids = await tasks.redis.pop_ready("default", 10, 0.1)
    assert ids == [str(created.task_id)]
    assert await tasks.claim("default", ids, "w-1", 30) == []
    assert await redis_client.zrange(keys.ready("default"), 0, -1) == [str(created.task_id)]
    await tasks.pg.queues.resume("default")
    ids = await tasks.redis.pop_ready("default", 10, 0.1)
    [claimed] = await tasks.claim("default", ids, "w-1", 30)
    assert claimed.task_id == created.task_id


async def test_fetchers_of_a_paused_queue_stop_popping_and_only_ask_twice_a_second_whether_it_resumed(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ran, _ = register(registry)
    async with start_instance() as a, start_instance(), http(a) as client:
        assert (await client.post(PAUSE)).status_code == 200
        await create(client, "pause.job", 20)
        await anyio.sleep(1.5)  # each fetcher meets a refused claim (or not) and settles
        before = await _transactions(pool)
        await anyio.sleep(3)
        spent = await _transactions(pool) - before
    # Two fetchers asking every 0.5 s, heartbeats, the samplers and the reconcilers every 5 s:
    # about a hundred straight to PostgreSQL, about 230 through PgBouncer (asyncpg keeps no
    # statement cache there), and 450 was seen under CI's load (the window is then longer).
    # A fetcher popping and being refused in a loop makes thousands (16,146 seen).
    assert spent < 1_000, f"{spent} transactions in 3 s while the queue was paused"
    assert ran == []


async def _transactions(pool: asyncpg.Pool) -> int:
    """Transactions committed in this database so far (PostgreSQL's statistics, flushed first)."""
    await pool.execute("SELECT pg_stat_force_next_flush()")
    await anyio.sleep(1.1)  # other backends flush their counts at most once a second when idle
    return int(await pool.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))


async def test_pausing_a_queue_never_paused_before_any_task_or_worker_is_allowed(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.post("/api/v1/queues/reports.v2/pause", content=b"")
        assert r.status_code == 200 and r.json()["paused"] is True and r.json()["reason"] is None, r.text
        r = await client.post("/api/v1/queues/never-paused/resume")
        assert r.json() == {"queue": "never-paused", "paused": False, "paused_at": None, "reason": None}


BAD_PAUSES = [
    invalid("pause of a queue with a space", "POST", "/api/v1/queues/bad%20q/pause", "queue", QUEUE_PATTERN),
    invalid("resume of a queue with a space", "POST", "/api/v1/queues/bad%20q/resume", "queue", QUEUE_PATTERN),
    invalid("pause of a queue of 129 characters", "POST", f"/api/v1/queues/{'q' * 129}/pause", "queue", QUEUE_PATTERN),
    invalid("pause body a JSON array", "POST", PAUSE, "body", "must be a JSON object", json=[1]),
    invalid(
        "pause reason empty", "POST", PAUSE, "reason", "String should have at least 1 character", json={"reason": ""}
    ),
    invalid(
        "pause reason of 501 characters",
        "POST",
        PAUSE,
        "reason",
        "String should have at most 500 characters",
        json={"reason": "r" * 501},
    ),
    invalid("pause reason a number", "POST", PAUSE, "reason", "Input should be a valid string", json={"reason": 5}),
    invalid("pause reason with NUL", "POST", PAUSE, "reason", "contains a NUL character", json={"reason": "a\x00b"}),
    invalid("pause extra field", "POST", PAUSE, "why", "unknown field", json={"why": "x"}),
    malformed("pause body not JSON", b"{", "unexpected end of data: line 1 column 2 (char 1)", path=PAUSE),
]


@pytest.mark.parametrize("bad", BAD_PAUSES, ids=lambda b: b.case)
async def test_a_bad_pause_request_gets_its_exact_problem_and_pauses_nothing(
    bad: Bad, start_instance: Any, pool: asyncpg.Pool
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.request(bad.method, bad.path, **bad.request)
    assert_problem(r, bad)
    assert await pool.fetchval("SELECT count(*) FROM queues") == 0


async def _is(client: httpx.AsyncClient, task_id: str, status: str) -> bool:
    return await status_of(client, task_id) == status


async def _all_completed(client: httpx.AsyncClient, ids: list[str]) -> bool:
    for task_id in ids:
        if await status_of(client, task_id) != "completed":
            return False
    return True


async def _metric_is(client: httpx.AsyncClient, value: float) -> str | None:
    text = (await client.get("/metrics")).text
    return text if sample(text, "taskmesh_queue_paused", queue="default") == value else None
