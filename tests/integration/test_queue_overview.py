"""The queues as an operator sees them: ``GET /api/v1/queues`` and ``GET /api/v1/queues/{q}``.

Every queue with tasks, a pause or a live instance serving it is listed with
its depth by state (ready, delayed, retrying, running, dead-lettered), the age
of its oldest ready task, whether it is paused, the instances serving it with
their concurrency, and the runs that ended in the last full minute and the
current one (every instance's sampler adds its own to ``queue_minutes``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

import taskmesh
from taskmesh.services import retention
from taskmesh.services.run_tally import RunTally
from taskmesh.store import Stores
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.states import Outcome
from tests.conftest import http, wait_for
from tests.integration.test_api_bad_input import QUEUE_PATTERN, assert_problem, invalid

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"
ZERO = {"succeeded": 0, "retried": 0, "failed": 0, "cancelled": 0, "interrupted": 0}


def register(registry: Registry) -> anyio.Event:
    """``ov.ok`` succeeds, ``ov.fail`` fails for good, ``ov.later`` retries in an hour, ``ov.slow`` waits."""
    release = anyio.Event()

    @registry.task("ov.ok")
    async def ok(payload: Any) -> None:
        return None

    @registry.task("ov.fail", max_retries=0)
    async def fail(payload: Any) -> None:
        raise taskmesh.NonRetryableError("no such customer")

    @registry.task("ov.later", max_retries=5)
    async def later(payload: Any) -> None:
        raise taskmesh.Retry("the bank is closed", delay_seconds=3600)

    @registry.task("ov.slow")
    async def slow(payload: Any) -> None:
        await release.wait()

    return release


async def create(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    r = await client.post(TASKS, json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["task_id"])


def runs_of(queue: dict[str, Any]) -> dict[str, int]:
    """The run counts of both windows added up (a test may straddle a minute's end)."""
    last, this = queue["runs"]["last_minute"], queue["runs"]["this_minute"]
    return {k: last[k] + this[k] for k in ZERO}


async def test_the_queue_list_shows_depths_by_state_pause_workers_and_the_runs_of_the_minute(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    release = register(registry)
    async with (
        start_instance(queue_names=["default", "reports"], worker_concurrency=4, metrics_sample_seconds=0.2) as inst,
        http(inst) as client,
    ):
        for _ in range(3):
            await create(client, {"name": "ov.ok"})
        await create(client, {"name": "ov.fail"})
        await create(client, {"name": "ov.later"})
        slow = await create(client, {"name": "ov.slow"})
        for _ in range(2):
            await create(client, {"name": "ov.ok", "delay_seconds": 3600})
        await create(client, {"name": "ov.ok", "queue_name": "typo"})
        assert (await client.post("/api/v1/queues/frozen/pause", json={"reason": "audit"})).status_code == 200

        async def settled() -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get("/api/v1/queues")).json()
            default = next(q for q in body["queues"] if q["queue"] == "default")
            counted = runs_of(default)
            return body if (counted["succeeded"], counted["failed"], counted["retried"]) == (3, 1, 1) else None

        listed = await wait_for(settled, timeout=15)
        one = (await client.get("/api/v1/queues/typo")).json()
        unused = (await client.get("/api/v1/queues/nothing.here")).json()
        release.set()
        await wait_for(lambda: _status_is(client, slow, "completed"))

    by_name = {q["queue"]: q for q in listed["queues"]}
    assert sorted(by_name) == ["default", "frozen", "reports", "typo"]
    default = by_name["default"]
    assert default["depth"] == {"ready": 0, "delayed": 3, "retrying": 1, "running": 1, "dead_letter": 1}
    assert default["workers"] == [{"worker_id": inst.worker_id, "state": "running", "concurrency": 4}]
    assert (default["concurrency"], default["paused"], default["oldest_ready_age_seconds"]) == (4, False, 0)
    assert runs_of(default) == {**ZERO, "succeeded": 3, "failed": 1, "retried": 1}
    frozen = by_name["frozen"]
    assert (frozen["paused"], frozen["reason"], frozen["workers"], frozen["concurrency"]) == (True, "audit", [], 0)
    assert by_name["reports"]["depth"] == dict.fromkeys(("ready", "delayed", "retrying", "running", "dead_letter"), 0)
    assert one["depth"]["ready"] == 1 and one["workers"] == [] and one["oldest_ready_age_seconds"] > 0
    assert one == {**by_name["typo"], "oldest_ready_age_seconds": one["oldest_ready_age_seconds"]}
    assert unused == {
        "queue": "nothing.here",
        "paused": False,
        "paused_at": None,
        "reason": None,
        "depth": dict.fromkeys(("ready", "delayed", "retrying", "running", "dead_letter"), 0),
        "oldest_ready_age_seconds": 0,
        "workers": [],
        "concurrency": 0,
        "runs": {"last_minute": ZERO, "this_minute": ZERO},
    }


async def test_runs_counted_on_several_instances_add_up_in_one_row_per_minute(
    stores: Stores, pool: asyncpg.Pool
) -> None:
    first, second = RunTally(), RunTally()
    for _ in range(3):
        first.add("default", Outcome.SUCCEEDED)
    second.add("default", Outcome.SUCCEEDED)
    second.add("default", Outcome.RETRY)
    second.add("reports", Outcome.INTERRUPTED)
    for tally in (first, second):
        await stores.pg.queues.add_minute(tally.take())
    assert first.take() == {} and second.take() == {}
    rows = {r["queue"]: dict(r) for r in await pool.fetch("SELECT * FROM queue_minutes")}
    assert set(rows) == {"default", "reports", "*"}  # "*": every queue's runs together, for the charts
    assert (rows["default"]["succeeded"], rows["default"]["retried"], rows["reports"]["interrupted"]) == (4, 1, 1)
    assert (rows["*"]["succeeded"], rows["*"]["retried"], rows["*"]["interrupted"]) == (4, 1, 1)


async def test_counts_that_could_not_be_written_are_put_back_and_written_with_the_next_ones() -> None:
    tally = RunTally()
    tally.add("default", Outcome.FAILED)
    taken = tally.take()
    tally.add("default", Outcome.FAILED)
    tally.put_back(taken)
    assert tally.take() == {"default": {"failed": 2}}


async def test_retention_deletes_the_minutes_older_than_retention_stats_days(
    stores: Stores, pool: asyncpg.Pool
) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    await pool.execute("DELETE FROM queue_minutes")
    for age in (timedelta(days=31), timedelta(days=29), timedelta(0)):
        await pool.execute("INSERT INTO queue_minutes (queue, minute, succeeded) VALUES ('default', $1, 1)", now - age)
    deleted = await retention.run_once(stores.pg, {}, stats_seconds=30 * 86400)
    assert deleted == {"queue_minutes": 1}
    assert await pool.fetchval("SELECT count(*) FROM queue_minutes") == 2


async def test_a_bad_queue_name_gets_its_exact_problem(start_instance: Any) -> None:
    bad = invalid("queue with a space", "GET", "/api/v1/queues/bad%20q", "queue", QUEUE_PATTERN)
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        assert_problem(await client.get(bad.path), bad)


async def _status_is(client: httpx.AsyncClient, task_id: str, status: str) -> bool:
    body: dict[str, Any] = (await client.get(f"{TASKS}/{task_id}")).json()
    return bool(body["task"]["status"] == status)
