"""``GET /api/v1/tasks/{id}`` reads the task and its latest run in one statement.

Before, two statements read them, so a reader could get a ``running`` task
with a ``succeeded`` run (the committer finishing the run between the two
reads). Readers here hammer the route while runs finish, and every answer
must pair states that exist together.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest

from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

TOGETHER = {
    "queued": {"queued", "retrying"},
    "running": {"running"},
    "completed": {"succeeded"},
}


async def test_a_task_and_its_latest_run_always_come_from_one_moment(start_instance: Any, registry: Registry) -> None:
    @registry.task("quick")
    async def quick(payload: Any) -> int:
        await anyio.sleep(random.uniform(0, 0.003))
        return 1

    mismatches: list[tuple[str, str]] = []
    reads = 0
    async with start_instance(worker_concurrency=8, commit_flush_ms=1) as inst, http(inst) as client:
        ids = [
            r["task_id"]
            for r in (
                await client.post("/api/v1/tasks:batch", json={"tasks": [{"name": "quick"} for _ in range(1000)]})
            ).json()["results"]
        ]
        done = anyio.Event()

        async def read() -> None:
            nonlocal reads
            while not done.is_set():
                body = (await client.get(f"/api/v1/tasks/{random.choice(ids)}")).json()
                reads += 1
                task, run = body["task"]["status"], body["latest_run"]["status"]
                if run not in TOGETHER[task]:
                    mismatches.append((task, run))

        async def all_done() -> bool:
            bodies = [(await client.get(f"/api/v1/tasks/{tid}")).json() for tid in ids[::50]]
            return all(b["task"]["status"] == "completed" for b in bodies)

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(read)
            await wait_for(all_done, timeout=60, interval=0.2)
            done.set()
    assert reads > 300
    assert mismatches == []
