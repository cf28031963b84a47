"""Bulk operations: ``POST /api/v1/tasks:bulk`` with a dry run first, then in the background.

A dry run counts what a filter matches and shows a sample at once; a real run is
answered 202 with an operation that ``GET /api/v1/operations/{id}`` follows to its
end, with every matching task acted on once: also while workers run the very
tasks being replayed, and when the operation's instance is gone (another takes its
lease over and goes on from its cursor). Bad requests get their exact problems.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

import anyio
import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from taskmesh.errors import NonRetryableError
from taskmesh.services import operations
from taskmesh.store import Stores
from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from tests.conftest import http, wait_for
from tests.integration.test_api_bad_input import Bad, assert_problem, invalid

pytestmark = pytest.mark.anyio

BULK = "/api/v1/tasks:bulk"


def register(registry: Registry) -> dict[str, list[int]]:
    """``bulk.flaky`` fails for good on its first attempt and records every attempt by ``n``."""
    attempts: dict[str, list[int]] = {}

    @registry.task("bulk.flaky", max_retries=0)
    async def flaky(payload: dict[str, int], ctx: Any) -> int:
        attempts.setdefault(str(payload["n"]), []).append(int(ctx.attempt))
        await anyio.sleep(0.01)
        if ctx.attempt == 1:
            raise NonRetryableError("first attempts fail")
        return payload["n"]

    return attempts


async def failed_count(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'failed'"))


async def operation(client: httpx.AsyncClient, op_id: str, status: str) -> dict[str, Any] | None:
    body: dict[str, Any] = (await client.get(f"/api/v1/operations/{op_id}")).json()
    return body if body["status"] == status else None


async def test_a_dry_run_counts_then_a_replay_by_filter_acts_on_each_task_once_while_workers_run(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    attempts = register(registry)
    async with start_instance(worker_concurrency=8) as inst, http(inst) as client:
        r = await client.post(
            "/api/v1/tasks:batch", json={"tasks": [{"name": "bulk.flaky", "payload": {"n": n}} for n in range(600)]}
        )
        assert r.json()["created"] == 600
        await wait_for(lambda: _is(failed_count(pool), 600), timeout=60)
        dry = await client.post(BULK, json={"filter": {"status": "failed"}, "action": "replay", "dry_run": True})
        assert dry.status_code == 200, dry.text
        assert (dry.json()["matched"], dry.json()["complete"], len(dry.json()["sample"])) == (600, True, 10)
        assert await failed_count(pool) == 600  # a dry run changes nothing
        real = await client.post(
            BULK, json={"filter": {"status": ["failed"], "name": "bulk.flaky"}, "action": "replay", "reason": "fixed"}
        )
        assert real.status_code == 202, real.text
        op = real.json()
        assert (op["status"], op["action"], op["reason"], real.headers["location"]) == (
            "running",
            "replay",
            "fixed",
            f"/api/v1/operations/{op['operation_id']}",
        )
        done = await wait_for(functools.partial(operation, client, op["operation_id"], "done"), timeout=60)
        await wait_for(lambda: _is(_completed(pool), 600), timeout=60)
    assert (done["done"], done["skipped"]) == (600, 0)
    assert done["filter"] == {"status": ["failed"], "name": "bulk.flaky"}
    assert sorted(attempts) == sorted(str(n) for n in range(600))
    assert all(a == [1, 2] for a in attempts.values()), "a task was replayed twice or not at all"
    assert await redis_client.zrange(keys.dlq("default"), 0, -1) == []


async def test_an_operation_whose_instance_is_gone_is_taken_over_and_finished_from_its_cursor(
    tasks: Tasks, stores: Stores, pool: asyncpg.Pool
) -> None:
    await pool.execute(
        """INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at, created_at)
           SELECT gen_random_uuid(), 'old', 'immediate', 'default', 0, '{}', 3, 'completed', now(),
                  '2026-01-01'::timestamptz + g * interval '1 second'
           FROM generate_series(1, 1200) g"""
    )
    op = await stores.pg.operations.insert(uuid.uuid4(), "delete", '{"status": "completed"}', "cleanup")
    # A first instance takes it, deletes one batch, and is gone (its lease is never renewed).
    taken = await stores.pg.operations.take("gone", 0.5)
    assert taken is not None and taken["id"] == op["id"]
    ids = [r["id"] for r in await pool.fetch("SELECT id FROM tasks ORDER BY created_at, id LIMIT 500")]
    last = await pool.fetchrow("SELECT created_at, id FROM tasks WHERE id = $1", ids[-1])
    assert last is not None
    async with stores.pg.transaction() as tx:
        assert len(await tx.operations.delete(ids)) == 500
        assert await tx.operations.advance(op["id"], "gone", (last["created_at"], last["id"]), 500, 0, 0.5)
    assert await operations.run_once(tasks, "other") == {}  # the lease still holds
    await anyio.sleep(0.6)
    assert await operations.run_once(tasks, "other") == {"done": 700, "skipped": 0}
    row = await stores.pg.operations.get(op["id"])
    assert row is not None and (row["status"], row["done"], row["skipped"]) == ("done", 1200, 0)
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_cancel_by_filter_ends_queued_tasks_and_skips_finished_ones(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        for n in range(5):
            r = await client.post("/api/v1/tasks", json={"name": "later", "delay_seconds": 3600, "payload": {"n": n}})
            assert r.status_code == 201
        await pool.execute("UPDATE tasks SET status = 'completed' WHERE payload @> '{\"n\": 0}'")
        r = await client.post(BULK, json={"filter": {"name": "later"}, "action": "cancel", "reason": "t"})
        done = await wait_for(functools.partial(operation, client, r.json()["operation_id"], "done"), timeout=20)
    assert (done["done"], done["skipped"]) == (4, 1)
    rows = await pool.fetch("SELECT status, count(*) AS n FROM tasks GROUP BY status ORDER BY status")
    assert {r["status"]: r["n"] for r in rows} == {"cancelled": 4, "completed": 1}


BAD_BULKS = [
    invalid(
        "no filter",
        "POST",
        BULK,
        "filter",
        "give at least one filter (an action on every task is refused)",
        json={"filter": {}, "action": "delete"},
    ),
    invalid(
        "an unknown action",
        "POST",
        BULK,
        "action",
        "Input should be 'retry', 'replay', 'cancel' or 'delete'",
        json={"filter": {"status": "failed"}, "action": "explode"},
    ),
    invalid(
        "an unknown filter",
        "POST",
        BULK,
        "filter.stauts",
        "unknown filter",
        json={"filter": {"stauts": "failed"}, "action": "delete"},
    ),
    invalid(
        "a page parameter in the filter",
        "POST",
        BULK,
        "filter.cursor",
        "not a filter of a bulk action",
        json={"filter": {"cursor": "x"}, "action": "delete"},
    ),
    invalid(
        "a list for a single filter",
        "POST",
        BULK,
        "filter.queue",
        "takes one value (only status takes a list)",
        json={"filter": {"queue": ["a", "b"]}, "action": "delete"},
    ),
    invalid(
        "a bad status",
        "POST",
        BULK,
        "filter.status",
        "must be one of blocked, queued, running, completed, failed, cancelled, skipped",
        json={"filter": {"status": "done"}, "action": "delete"},
    ),
    invalid("no action", "POST", BULK, "action", "field required", json={"filter": {"status": "failed"}}),
]


@pytest.mark.parametrize("bad", BAD_BULKS, ids=lambda b: b.case)
async def test_a_bad_bulk_request_gets_its_exact_problem_and_starts_nothing(
    bad: Bad, start_instance: Any, pool: asyncpg.Pool
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        assert_problem(await client.request(bad.method, bad.path, **bad.request), bad)
    assert await pool.fetchval("SELECT count(*) FROM operations") == 0


async def test_an_unknown_operation_answers_404(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.get("/api/v1/operations/00000000-0000-4000-8000-000000000000")
    assert r.status_code == 404 and r.json()["detail"] == "no operation has id 00000000-0000-4000-8000-000000000000"


async def _is(count: Any, wanted: int) -> bool:
    return bool(await count == wanted)


async def _completed(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'completed'"))


async def test_acting_needs_a_reason_and_a_dry_run_does_not(start_instance: Any, pool: asyncpg.Pool) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        body = {"filter": {"status": "failed"}, "action": "delete"}
        dry = await client.post(BULK, json={**body, "dry_run": True})
        missing = await client.post(BULK, json=body)
        blank = await client.post(BULK, json={**body, "reason": "   "})
    assert dry.status_code == 200
    for refused in (missing, blank):
        assert (refused.status_code, refused.json()["detail"]) == (
            422,
            "reason: required to act (not for a dry run): kept with the operation and in the audit log",
        )
    assert await pool.fetchval("SELECT count(*) FROM operations") == 0
