"""The DLQ listing carries no payloads: each item says why it failed instead.

``GET /api/v1/queues/{q}/dlq?count=1000`` once loaded every payload: 36.9 MB for
40 tasks of 900 KiB. Now each item is the task without ``payload`` and with
``latest_run`` (attempt, status, error, finished_at), read in one statement that
does not read the payloads; ``GET /api/v1/tasks/{id}`` still has the payload.
"""

from __future__ import annotations

from typing import Any

import pytest

from taskmesh.errors import NonRetryableError
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for
from tests.integration.test_execution import facade

pytestmark = pytest.mark.anyio

TASKS = 40
BLOB = 900 * 1024
BODY_MAX = 100_000


async def test_a_dlq_of_forty_900_kib_tasks_lists_in_under_100_kb_with_each_error(
    start_instance: Any, registry: Registry
) -> None:
    @registry.task("dlq.heavy", max_retries=0)
    async def heavy(payload: dict[str, Any]) -> None:
        raise NonRetryableError(f"customer {payload['n']} is closed")

    async with start_instance(worker_concurrency=4) as inst, http(inst) as client:
        ids: dict[str, int] = {}
        for n in range(TASKS):
            r = await client.post("/api/v1/tasks", json={"name": "dlq.heavy", "payload": {"n": n, "blob": "x" * BLOB}})
            assert r.status_code == 201, r.text
            ids[r.json()["task_id"]] = n

        async def all_failed() -> bool:
            rows = await facade(inst).pg.tasks.list_failed_with_latest_run("default", 1000)
            return len(rows) == TASKS

        await wait_for(all_failed, timeout=60)
        rows = await facade(inst).pg.tasks.list_failed_with_latest_run("default", 1000)
        assert "payload" not in rows[0].keys(), "the statement reads the payloads"
        r = await client.get("/api/v1/queues/default/dlq", params={"count": "1000"})
        single = await client.get(f"/api/v1/tasks/{next(iter(ids))}")
    assert r.status_code == 200
    assert len(r.content) < BODY_MAX, f"the listing is {len(r.content)} bytes"
    body = r.json()
    assert (body["queue"], body["count"]) == ("default", TASKS)
    assert {t["id"] for t in body["tasks"]} == set(ids)
    for item in body["tasks"]:
        assert "payload" not in item
        assert item["status"] == "failed" and item["name"] == "dlq.heavy" and item["attempts"] == 1
        run = item["latest_run"]
        assert run["error"] == f"NonRetryableError: customer {ids[item['id']]} is closed", run
        assert (run["attempt"], run["status"]) == (1, "failed")
        assert run["finished_at"] is not None
    assert len(single.json()["task"]["payload"]["blob"]) == BLOB
