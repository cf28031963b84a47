"""Routing by what live instances advertise: a create through an instance (or a client) without a
task name's handler goes to the handler's queue with its retries and has its payload checked by
the schema the handler's instance advertises; a name nobody advertises is stored and logged; the
dev profile's demo fallback refuses a name a live instance has a handler for.

Two instances share the stores: ``real`` has the ``reports.export`` handler (queue ``reports``),
``bare`` has none (an API-only instance, or the dev profile with its demo fallback).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
import structlog
from pydantic import BaseModel, ConfigDict

from taskmesh.clients.client import Client
from taskmesh.config import Settings
from taskmesh.dev.demo import demo_handler
from taskmesh.errors import InvalidTaskError
from taskmesh.runtime.supervisor import Instance
from taskmesh.tasks.registry import Registry
from tests.conftest import REDIS_MODE, http, running, wait_for

pytestmark = pytest.mark.anyio


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    report_id: int
    note: str | None = None


def real_registry(ran: list[Any]) -> Registry:
    registry = Registry()

    @registry.task("reports.export", queue="reports", max_retries=7)
    async def export(payload: ExportRequest) -> dict[str, int]:
        ran.append(payload.report_id)
        return {"exported": payload.report_id}

    return registry


@pytest.fixture
async def real(make_settings: Callable[..., Settings], pool: asyncpg.Pool) -> AsyncIterator[tuple[Instance, list[Any]]]:
    ran: list[Any] = []
    settings = make_settings(queue_names=["reports"], api_enabled=False, scheduler_enabled=False)
    async with running(settings, real_registry(ran)) as inst:
        yield inst, ran


def until(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """``condition`` as :func:`wait_for` polls it."""

    async def check() -> bool:
        return condition()

    return check


async def task_row(pool: asyncpg.Pool, task_id: str) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT queue, max_retries, status FROM tasks WHERE id = $1", uuid.UUID(task_id))
    assert row is not None
    return row


async def test_a_create_through_an_instance_without_the_handler_is_routed_and_checked_as_advertised(
    real: tuple[Instance, list[Any]], make_settings: Callable[..., Settings], pool: asyncpg.Pool
) -> None:
    _, ran = real
    bare = make_settings(queue_names=["default"], workers_enabled=False)
    async with running(bare, Registry()) as inst, http(inst) as client:
        made = await client.post("/api/v1/tasks", json={"name": "reports.export", "payload": {"report_id": "7"}})
        missing = await client.post("/api/v1/tasks", json={"name": "reports.export", "payload": {"note": "x"}})
        extra = await client.post(
            "/api/v1/tasks", json={"name": "reports.export", "payload": {"report_id": 1, "format": "pdf"}}
        )
        wrong = await client.post("/api/v1/tasks", json={"name": "reports.export", "payload": {"report_id": "q4"}})
        batch = await client.post(
            "/api/v1/tasks:batch",
            json={"tasks": [{"name": "reports.export", "payload": {"report_id": 8}}, {"name": "reports.export"}]},
        )
        with structlog.testing.capture_logs() as logs:
            unknown = await client.post("/api/v1/tasks", json={"name": "reprot.export"})
            again = await client.post("/api/v1/tasks", json={"name": "reprot.export"})
        await wait_for(until(lambda: sorted(ran) == [7, 8]), timeout=10)
    assert made.status_code == 201, made.text
    assert made.json().get("warnings") is None
    row = await task_row(pool, made.json()["task_id"])
    assert (row["queue"], row["max_retries"]) == ("reports", 7)
    assert (missing.status_code, missing.json()["detail"]) == (422, "payload.report_id: Field required")
    assert (extra.status_code, extra.json()["detail"]) == (422, "payload.format: Extra inputs are not permitted")
    assert (wrong.status_code, wrong.json()["detail"]) == (422, "payload.report_id: Input should be a valid integer")
    results = batch.json()["results"]
    assert results[0]["status"] == "created"
    assert results[1] == {
        "index": 1,
        "status": "rejected",
        "errors": [{"field": "tasks[1].payload.report_id", "message": "Field required"}],
    }
    assert unknown.status_code == again.status_code == 201
    unadvertised = [e for e in logs if e["event"] == "task_name_unadvertised"]
    assert [(e["log_level"], e["task_name"]) for e in unadvertised] == [("warning", "reprot.export")]  # once
    assert (await task_row(pool, unknown.json()["task_id"]))["queue"] == "default"
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 4


async def test_a_client_without_the_handler_routes_and_checks_as_advertised(
    real: tuple[Instance, list[Any]], database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    _, ran = real
    async with Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=Registry()) as c:
        task_id = await c.enqueue("reports.export", {"report_id": 3})
        with pytest.raises(InvalidTaskError) as caught:
            await c.enqueue_many([{"name": "reports.export", "payload": {"report_id": 4}}, {"name": "reports.export"}])
        copied = await c.enqueue_many(
            [{"name": "reports.export", "payload": {"report_id": 100 + i}} for i in range(64)]
        )
    assert (caught.value.field, caught.value.message) == ("tasks[1].payload.report_id", "Field required")
    assert (await task_row(pool, str(task_id)))["queue"] == "reports"
    queues = await pool.fetch("SELECT DISTINCT queue, max_retries FROM tasks")
    assert [(r["queue"], r["max_retries"]) for r in queues] == [("reports", 7)]
    assert len(copied) == 64
    await wait_for(until(lambda: len(ran) == 65), timeout=15)


async def test_the_demo_fallback_refuses_a_name_a_live_instance_has_a_handler_for(
    real: tuple[Instance, list[Any]], make_settings: Callable[..., Settings], pool: asyncpg.Pool
) -> None:
    _, ran = real
    dev = Registry()
    dev.fallback = demo_handler()
    async with running(make_settings(queue_names=["default"]), dev) as inst, http(inst) as client:
        # Named on the dev profile's own queue: the real instance never sees it there.
        theirs = await client.post(
            "/api/v1/tasks", json={"name": "reports.export", "queue_name": "default", "payload": {"report_id": 5}}
        )
        demo = await client.post("/api/v1/tasks", json={"name": "hello", "payload": {}})
        task_id = theirs.json()["task_id"]

        async def ended(tid: str) -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get(f"/api/v1/tasks/{tid}")).json()
            return body if body["task"]["status"] in ("completed", "failed") else None

        refused = await wait_for(lambda: ended(task_id), timeout=10)
        ran_demo = await wait_for(lambda: ended(demo.json()["task_id"]), timeout=10)
    assert refused["task"]["status"] == "failed"  # not "completed" with {"ok": true}
    assert refused["latest_run"]["result"] is None
    worker = real[0].worker_id
    assert refused["latest_run"]["error"] == (
        f"not run by the fallback handler: live instance {worker} has a handler for 'reports.export' "
        f"(queue 'reports'); retry it there: POST /api/v1/tasks/{task_id}/retry "
        '{"queue_name": "reports"}'
    )
    assert ran_demo["task"]["status"] == "completed" and ran_demo["latest_run"]["result"]["ok"] is True
    assert ran == []
