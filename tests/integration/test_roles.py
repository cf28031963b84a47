"""Roles: a worker-only instance (API off) and an API-only instance (workers off)."""

from __future__ import annotations

from typing import Any

import pytest

from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio


async def test_a_worker_only_instance_serves_health_and_metrics_but_no_api(
    start_instance: Any, registry: Registry, tasks: Tasks
) -> None:
    @registry.task("roles.work")
    async def work(payload: Any) -> str:
        return "done"

    async with start_instance(api_enabled=False) as inst, http(inst) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200 and "taskmesh_tasks_created_total" in metrics.text
        r = await client.post("/api/v1/tasks", json={"name": "roles.work"})
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
        assert "/api/v1/tasks" not in (await client.get("/openapi.json")).json()["paths"]
        enqueued = await tasks.enqueue(TaskSpec(name="roles.work"))

        async def done() -> bool:
            task, _ = await tasks.get(enqueued.task_id)
            status: str = task["status"]
            return status == "completed"

        await wait_for(done)


async def test_an_api_only_instance_takes_tasks_but_runs_none(
    start_instance: Any, registry: Registry, tasks: Tasks
) -> None:
    @registry.task("roles.work")
    async def work(payload: Any) -> str:
        return "done"

    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.post("/api/v1/tasks", json={"name": "roles.work"})
        assert r.status_code == 201
        assert r.json()["warnings"] == ["queue 'default' is served by no live instance"]
        assert (await client.get("/api/v1/workers")).json() == {
            "workers": [],
            "unserved_queues": [{"queue": "default", "queued": 1}],
            "paused_queues": [],
        }
        assert (await client.get("/readyz")).status_code == 200
        task, run = await tasks.get(r.json()["task_id"])
        assert task["status"] == "queued" and run is not None and run["status"] == "queued"
