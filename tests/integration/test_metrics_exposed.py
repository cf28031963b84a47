"""What /metrics exposes on a live instance: sampled depths and ages, HTTP by route template, no ids."""

from __future__ import annotations

import re
from typing import Any

import pytest

from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if found == labels:
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_an_api_only_instance_samples_depths_and_counts_requests_by_route(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False, metrics_sample_seconds=0.1) as inst, http(inst) as client:
        ids = []
        for _ in range(3):
            r = await client.post("/api/v1/tasks", json={"name": "metrics.waiting"})
            ids.append(r.json()["task_id"])
        await client.post("/api/v1/tasks", json={"name": "metrics.later", "delay_seconds": 3600})
        assert (await client.get(f"/api/v1/tasks/{ids[0]}")).status_code == 200
        assert (await client.get("/no/such/route")).status_code == 404

        async def sampled() -> str | None:
            text = (await client.get("/metrics")).text
            ready = sample(text, "taskmesh_queue_depth", queue="default", state="ready")
            delayed = sample(text, "taskmesh_queue_depth", queue="default", state="delayed")
            age = sample(text, "taskmesh_queue_oldest_ready_age_seconds", queue="default") or 0
            return text if (ready, delayed) == (3, 1) and age > 0 else None

        text = await wait_for(sampled)
    assert sample(text, "taskmesh_queue_depth", queue="default", state="running") == 0
    assert sample(text, "taskmesh_queue_depth", queue="default", state="dead_letter") == 0
    assert sample(text, "taskmesh_tasks_created_total", queue="default") == 4
    assert sample(text, "taskmesh_http_requests_total", method="POST", route="/api/v1/tasks", status="201") == 4
    by_id = {"method": "GET", "route": "/api/v1/tasks/{task_id}", "status": "200"}
    assert sample(text, "taskmesh_http_requests_total", **by_id) == 1
    assert sample(text, "taskmesh_http_requests_total", method="GET", route="unmatched", status="404") == 1
    assert sample(text, "taskmesh_store_errors_total", store="postgres") == 0
    assert sample(text, "taskmesh_workers", state="running") is not None
    assert not UUID.search(text), "a task id leaked into a label"


async def test_a_worker_instance_counts_starts_waits_outcomes_and_heartbeats(
    start_instance: Any, registry: Registry
) -> None:
    from taskmesh.errors import Retry

    @registry.task("metrics.flaky", max_retries=1)
    async def flaky(payload: Any, ctx: Any) -> str:
        if ctx.attempt == 1:
            raise Retry(delay_seconds=0)
        return "ok"

    async with start_instance(metrics_sample_seconds=0.1, worker_concurrency=2) as inst, http(inst) as client:
        r = await client.post("/api/v1/tasks", json={"name": "metrics.flaky"})
        task_id = r.json()["task_id"]

        async def done() -> bool:
            body = (await client.get(f"/api/v1/tasks/{task_id}")).json()
            return bool(body["task"]["status"] == "completed")

        await wait_for(done)
        text = (await client.get("/metrics")).text
    labels = {"queue": "default", "task_name": "metrics.flaky"}
    assert sample(text, "taskmesh_runs_started_total", **labels) == 2
    assert sample(text, "taskmesh_runs_finished_total", outcome="retrying", **labels) == 1
    assert sample(text, "taskmesh_runs_finished_total", outcome="succeeded", **labels) == 1
    assert sample(text, "taskmesh_queue_wait_seconds_count", **labels) == 2
    assert sample(text, "taskmesh_run_duration_seconds_count", **labels) == 2
    assert sample(text, "taskmesh_concurrency", queue="default") == 2
    assert (sample(text, "taskmesh_heartbeats_total") or 0) >= 1
    assert (sample(text, "taskmesh_workers", state="running") or 0) >= 1
