"""A result or error PostgreSQL cannot store fails that one run, never the committer.

Before, a handler whose return value or error text held U+0000 (or a lone
surrogate) made the committer retry the same batch for ever as a "store
outage": no result of that instance was written again. These tests go through
a real instance and real stores, and only through the HTTP API and the rows.
"""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from taskmesh.tasks.models import TaskContext
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

REFUSED_NUL = "handler result refused: result: contains a NUL character, which PostgreSQL cannot store"
REFUSED_SURROGATE = (
    "handler result refused: result.rows[1].name: contains a lone surrogate (not valid Unicode), "
    "which PostgreSQL cannot store"
)


async def create(client: httpx.AsyncClient, name: str, **fields: Any) -> str:
    r = await client.post("/api/v1/tasks", json={"name": name, **fields})
    assert r.status_code == 201, r.text
    task_id: str = r.json()["task_id"]
    return task_id


async def finished(client: httpx.AsyncClient, task_ids: list[str]) -> dict[str, Any] | None:
    bodies = {}
    for tid in task_ids:
        body = (await client.get(f"/api/v1/tasks/{tid}")).json()
        if body["task"]["status"] not in ("completed", "failed", "cancelled"):
            return None
        bodies[tid] = body
    return bodies


async def test_unstorable_results_fail_their_runs_alone_and_every_other_result_is_written(
    start_instance: Any, registry: Registry
) -> None:
    @registry.task("returns.nul", max_retries=3)
    async def returns_nul(payload: Any) -> str:
        return "a\x00b"

    @registry.task("returns.surrogate", max_retries=3)
    async def returns_surrogate(payload: Any) -> dict[str, Any]:
        return {"rows": [{"name": "ok"}, {"name": "bad \ud800"}]}

    @registry.task("fine")
    async def fine(payload: Any, ctx: TaskContext) -> int:
        return ctx.attempt

    async with start_instance(worker_concurrency=4) as inst, http(inst) as client:
        nul = await create(client, "returns.nul")
        surrogate = await create(client, "returns.surrogate")
        others = [await create(client, "fine") for _ in range(20)]
        bodies = await wait_for(lambda: finished(client, [nul, surrogate, *others]), timeout=15)
        assert (await client.get("/readyz")).status_code == 200
        # The instance keeps writing results after them.
        later = await create(client, "fine")
        await wait_for(lambda: finished(client, [later]), timeout=10)
    assert [bodies[t]["task"]["status"] for t in others] == ["completed"] * 20
    # A result refused is not retried: the same handler would return the same value.
    assert bodies[nul]["task"]["status"] == "failed"
    assert bodies[nul]["latest_run"]["error"] == REFUSED_NUL
    assert bodies[nul]["latest_run"]["attempt"] == 1
    assert bodies[surrogate]["task"]["status"] == "failed"
    assert bodies[surrogate]["latest_run"]["error"] == REFUSED_SURROGATE


async def test_error_texts_with_nul_and_lone_surrogates_are_stored_escaped(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    @registry.task("raises.bad.text", max_retries=1)
    async def raises(payload: Any) -> None:
        raise ValueError("bad \x00 byte and \ud800 half")

    async with start_instance() as inst, http(inst) as client:
        tid = await create(client, "raises.bad.text")
        bodies = await wait_for(lambda: finished(client, [tid]), timeout=15)
        runs = (await client.get(f"/api/v1/tasks/{tid}/runs")).json()["runs"]
    assert bodies[tid]["task"]["status"] == "failed"  # retried once, then dead-lettered: errors were written
    assert [r["status"] for r in runs] == ["retrying", "failed"]
    assert runs[0]["error"] == "ValueError: bad \\x00 byte and \\ud800 half"


async def test_a_run_that_fails_many_times_with_a_poison_error_never_stops_other_results(
    start_instance: Any, registry: Registry
) -> None:
    @registry.task("poison.retry", max_retries=2)
    async def poison(payload: Any) -> None:
        raise RuntimeError("\x00" * 10)

    @registry.task("fine.slow")
    async def fine_slow(payload: Any) -> str:
        await anyio.sleep(0.05)
        return "ok"

    async with start_instance(worker_concurrency=8) as inst, http(inst) as client:
        ids = [await create(client, "poison.retry", priority=10) for _ in range(5)]
        ids += [await create(client, "fine.slow") for _ in range(30)]
        bodies = await wait_for(lambda: finished(client, ids), timeout=30)
    statuses = [bodies[t]["task"]["status"] for t in ids]
    assert statuses == ["failed"] * 5 + ["completed"] * 30
