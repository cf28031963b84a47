"""Waiting for a task's end: ``GET /api/v1/tasks/{id}?wait=N``.

The answer comes as soon as the task is completed, failed or cancelled, or when N
seconds passed. The end is heard on a Redis channel that the committer publishes
to only while someone waits; the waiting request does not read the task in a loop.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from taskmesh.store import Stores
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for
from tests.integration.test_api_bad_input import Bad, assert_problem, invalid

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"
WAIT_RANGE = "must be a number of seconds between 0 and 60"


def register(registry: Registry) -> None:
    @registry.task("wait.short")
    async def short(payload: Any) -> str:
        await anyio.sleep(0.3)
        return "done"


async def create(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    r = await client.post(TASKS, json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["task_id"])


async def test_a_wait_on_an_api_only_instance_answers_when_a_worker_elsewhere_finishes_the_task(
    start_instance: Any, registry: Registry
) -> None:
    register(registry)
    async with (
        start_instance(workers_enabled=False) as api,
        start_instance() as worker,
        http(api) as client,
        http(worker) as worker_client,
    ):
        await wait_for(lambda: _live(api))
        task_id = await create(worker_client, {"name": "wait.short", "delay_seconds": 0.5})
        t0 = time.monotonic()
        r = await client.get(f"{TASKS}/{task_id}", params={"wait": "30"})
        took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert (r.json()["task"]["status"], r.json()["latest_run"]["result"]) == ("completed", "done")
    assert took < 15, took  # answered at the end, not at the deadline


async def test_a_wait_answers_at_its_deadline_in_the_state_the_task_is_in(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        task_id = await create(client, {"name": "wait.short", "delay_seconds": 3600})
        t0 = time.monotonic()
        r = await client.get(f"{TASKS}/{task_id}", params={"wait": "1.5"})
        took = time.monotonic() - t0
        finished = await create(client, {"name": "wait.short", "delay_seconds": 3600})
        assert (await client.post(f"{TASKS}/{finished}/cancel")).status_code == 200
        t1 = time.monotonic()
        at_once = await client.get(f"{TASKS}/{finished}", params={"wait": "60"})
        took_finished = time.monotonic() - t1
    assert r.status_code == 200 and r.json()["task"]["status"] == "queued"
    assert took >= 1.5, took
    assert at_once.json()["task"]["status"] == "cancelled" and took_finished < 1.5


async def test_the_waiting_request_hears_the_end_on_the_channel_and_does_not_read_the_task_in_a_loop(
    start_instance: Any, pool: asyncpg.Pool, stores: Stores
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        await wait_for(lambda: _live(inst))
        task_id = await create(client, {"name": "wait.short", "delay_seconds": 3600})
        answers: list[httpx.Response] = []

        async def waiting() -> None:
            answers.append(await client.get(f"{TASKS}/{task_id}", params={"wait": "30"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting)
            await anyio.sleep(0.5)
            assert await stores.redis.client.exists(stores.redis.keys.finished_waiters()) == 1
            # Finished behind taskmesh's back: nothing is announced, and a waiter that read the
            # task in a loop would see it within a second.
            await pool.execute("UPDATE tasks SET status = 'completed' WHERE id = $1", task_id)
            await anyio.sleep(2.0)
            assert answers == [], "the waiter read the task again without being told"
            assert await stores.redis.finished.announce([task_id]) is True  # this instance's flag is set
            with anyio.fail_after(5):
                while not answers:
                    await anyio.sleep(0.02)
    assert answers[0].json()["task"]["status"] == "completed"


async def test_nothing_is_published_while_nobody_waits(stores: Stores) -> None:
    await stores.redis.client.delete(stores.redis.keys.finished_waiters())
    async with stores.redis.finished.subscribe():
        assert await stores.redis.finished.announce(["00000000-0000-4000-8000-000000000000"]) is False
        await stores.redis.finished.mark_waiting(1)
        assert await stores.redis.finished.announce(["00000000-0000-4000-8000-000000000000"]) is True


UNKNOWN = f"{TASKS}/00000000-0000-4000-8000-000000000000"
BAD_WAITS = [
    invalid(f"wait {raw!r}", "GET", f"{UNKNOWN}?wait={raw}", "wait", WAIT_RANGE)
    for raw in ("abc", "-1", "61", "nan", "inf", "")
]


@pytest.mark.parametrize("bad", BAD_WAITS, ids=lambda b: b.case)
async def test_a_bad_wait_gets_its_exact_problem(bad: Bad, start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        assert_problem(await client.get(bad.path), bad)


async def _live(inst: Any) -> bool:
    return bool(inst.state is not None and inst.state.waiters.live)
