"""Cancel and replay agree, and failed runs keep their traceback.

Before, a running task cancelled with 202 whose handler failed before the
next heartbeat was retried and completed (the README says not retried); and a
task that once got a cancel request and was later replayed from the DLQ had
its new run killed as ``cancelled`` (the request was never cleared).
"""

from __future__ import annotations

import functools
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from taskmesh.tasks.models import TaskContext
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio


async def status_of(client: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get(f"/api/v1/tasks/{task_id}")).json()
    return body


async def test_a_running_task_cancelled_whose_handler_then_fails_is_not_retried(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    release = anyio.Event()
    attempts: list[int] = []

    @registry.task("fails.after.cancel", max_retries=3)
    async def fails(payload: Any, ctx: TaskContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            await release.wait()
            raise ConnectionError("upstream refused")
        return "should not run again"

    # A long lease: the heartbeat (every lease / 3) does not come before the handler fails.
    async with start_instance(lease_seconds=60) as inst, http(inst) as client:
        tid = (await client.post("/api/v1/tasks", json={"name": "fails.after.cancel"})).json()["task_id"]
        await wait_for(lambda: _status_is(client, tid, "running"))
        r = await client.post(f"/api/v1/tasks/{tid}/cancel")
        assert (r.status_code, r.json()["status"]) == (202, "running")
        release.set()
        await wait_for(lambda: _status_is(client, tid, "cancelled"), timeout=10)
        await anyio.sleep(1.5)  # past the first backoff: a retry would have started by now
        body = await status_of(client, tid)
        runs = (await client.get(f"/api/v1/tasks/{tid}/runs")).json()["runs"]
    assert attempts == [1]
    assert body["task"]["status"] == "cancelled" and body["task"]["retries"] == 0
    assert [(r["attempt"], r["status"], r["next_retry_at"]) for r in runs] == [(1, "failed", None)]
    assert runs[0]["error"] == "ConnectionError: upstream refused (not retried: the task was cancelled)"


async def test_a_replayed_task_is_not_killed_by_a_cancel_request_of_an_earlier_cycle(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    @registry.task("replayed", max_retries=0)
    async def replayed(payload: Any, ctx: TaskContext) -> int:
        if ctx.attempt == 1:
            raise ValueError("first cycle fails")
        await anyio.sleep(1.0)  # several heartbeats (every 0.2 s) come while this run goes on
        return ctx.attempt

    async with start_instance(lease_seconds=0.6) as inst, http(inst) as client:
        tid = (await client.post("/api/v1/tasks", json={"name": "replayed"})).json()["task_id"]
        await wait_for(lambda: _status_is(client, tid, "failed"))
        # A cancel request left over from the earlier cycle (the old code never cleared it).
        await pool.execute("UPDATE tasks SET cancel_requested_at = now() WHERE id = $1", tid)
        r = await client.post("/api/v1/queues/default/dlq/replay", json={"count": 1})
        assert r.json()["replayed"] == [tid]
        await wait_for(lambda: _finished(client, tid), timeout=10)
        body = await status_of(client, tid)
    assert body["task"]["status"] == "completed"
    assert body["latest_run"]["attempt"] == 2 and body["latest_run"]["result"] == 2


async def test_a_failed_run_keeps_its_traceback_bounded_and_shows_it_in_the_runs(
    start_instance: Any, registry: Registry
) -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise KeyError("customer 42")
        deep(n - 1)

    @registry.task("traced", max_retries=0)
    async def traced(payload: Any) -> None:
        try:
            deep(int(payload["depth"]))
        except KeyError as exc:
            raise RuntimeError("lookup failed" + " and then some" * int(payload["pad"])) from exc

    async with start_instance() as inst, http(inst) as client:
        shallow = (
            await client.post("/api/v1/tasks", json={"name": "traced", "payload": {"depth": 2, "pad": 0}})
        ).json()
        longer = {"depth": 2, "pad": 3000}  # a 42 KB message: the traceback is longer than its bound
        deeper = (await client.post("/api/v1/tasks", json={"name": "traced", "payload": longer})).json()
        for t in (shallow, deeper):
            await wait_for(functools.partial(_status_is, client, t["task_id"], "failed"))
        [short] = (await client.get(f"/api/v1/tasks/{shallow['task_id']}/runs")).json()["runs"]
        [long] = (await client.get(f"/api/v1/tasks/{deeper['task_id']}/runs")).json()["runs"]
    assert short["error"] == "RuntimeError: lookup failed"
    assert "KeyError: 'customer 42'" in short["traceback"] and "in deep" in short["traceback"]
    assert short["traceback"].rstrip().endswith("RuntimeError: lookup failed")
    # Bounded to 16 KiB, keeping the end (the innermost frames and the error); the error to 2,000 chars.
    assert len(long["traceback"]) == 16_384 and long["traceback"].startswith("...")
    assert long["traceback"].rstrip().endswith("and then some and then some")
    assert len(long["error"]) == 2000 and long["error"].startswith("RuntimeError: lookup failed and then some")


async def _status_is(client: httpx.AsyncClient, task_id: str, status: str) -> bool:
    return bool((await status_of(client, task_id))["task"]["status"] == status)


async def _finished(client: httpx.AsyncClient, task_id: str) -> bool:
    return (await status_of(client, task_id))["task"]["status"] in ("completed", "failed", "cancelled")
