"""A trace id follows a task: from the request header to the task, the answer, the handler and the logs."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from taskmesh.tasks.models import TaskContext
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for
from tests.proc import call, spawn, stop, stores_env, wait_until

__all__ = ["spawn"]

pytestmark = pytest.mark.anyio

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_the_trace_id_of_a_request_reaches_the_task_the_answer_and_the_handler(
    start_instance: Any, registry: Registry
) -> None:
    seen: list[str | None] = []

    @registry.task("trace.seen")
    async def handler(payload: Any, ctx: TaskContext) -> None:
        seen.append(ctx.trace_id)

    async with start_instance() as inst, http(inst) as client:
        r = await client.post(
            "/api/v1/tasks", json={"name": "trace.seen"}, headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}
        )
        assert r.status_code == 201 and r.json()["trace_id"] == TRACE
        task_id = r.json()["task_id"]
        r = await client.post("/api/v1/tasks", json={"name": "trace.seen"}, headers={"X-Request-ID": "req-42"})
        assert r.json()["trace_id"] == "req-42"
        r = await client.post("/api/v1/tasks", json={"name": "trace.seen", "trace_id": "from-body"})
        assert r.json()["trace_id"] == "from-body"
        r = await client.post("/api/v1/tasks", json={"name": "trace.seen"})
        made = r.json()["trace_id"]
        assert re.fullmatch(r"[0-9a-f]{32}", made)
        r = await client.post(
            "/api/v1/tasks:batch", json={"tasks": [{"name": "trace.seen"}]}, headers={"X-Request-ID": "batch-1"}
        )
        assert r.json()["results"][0]["trace_id"] == "batch-1"
        await wait_for(lambda: _len_is(seen, 5))
        task = (await client.get(f"/api/v1/tasks/{task_id}")).json()["task"]
    assert task["trace_id"] == TRACE
    assert sorted(seen, key=str) == sorted([TRACE, "req-42", "from-body", made, "batch-1"])


async def _len_is(items: list[Any], n: int) -> bool:
    return len(items) == n


@pytest.mark.usefixtures("redis_client", "pool")
async def test_log_lines_about_a_task_carry_its_trace_id_on_the_worker_instance(
    spawn: Any, database_url: str, redis_url: str, prefix: str
) -> None:
    api = spawn(**stores_env(database_url, redis_url, prefix, TASKMESH_WORKERS_ENABLED="false"))
    worker = spawn(**stores_env(database_url, redis_url, prefix, TASKMESH_API_ENABLED="false"))
    for p in (api, worker):
        wait_until(lambda p=p: call(p.port, "GET", "/readyz")[0] == 200, proc=p)
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{api.port}/api/v1/tasks",
        data=json.dumps({"name": "poison_free_fail", "max_retries": 0}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        task_id = json.loads(resp.read())["task_id"]
    wait_until(lambda: any(e.get("task_id") == task_id for e in worker.events()), proc=worker)
    for p in (api, worker):
        assert stop(p, 20)[0] == 0
    lines = [e for e in worker.events() if e.get("task_id") == task_id]
    assert lines and all(e.get("trace_id") == TRACE for e in lines), lines
    for key in ("task_name", "queue", "attempt", "worker_id"):
        assert all(key in e for e in lines), (key, lines)


@pytest.mark.usefixtures("redis_client", "pool")
@pytest.mark.parametrize("log_payloads", ["false", "true"])
async def test_handler_lines_carry_the_task_keys_and_payloads_are_logged_only_when_asked(
    spawn: Any, database_url: str, redis_url: str, prefix: str, log_payloads: str
) -> None:
    proc = spawn(**stores_env(database_url, redis_url, prefix, TASKMESH_LOG_PAYLOADS=log_payloads))
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, proc=proc)
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "chatty", "payload": {"card": "4111-SECRET"}})
    assert status == 201
    task_id = body["task_id"]
    wait_until(lambda: any(e.get("event") == "run_finished" for e in proc.events()), proc=proc)
    assert stop(proc, 20)[0] == 0
    [said] = [e for e in proc.events() if e.get("event") == "handler_said"]
    assert said["task_id"] == task_id and said["trace_id"] == body["trace_id"] and said["attempt"] == 1
    [finished] = [e for e in proc.events() if e.get("event") == "run_finished"]
    assert finished["outcome"] == "failed" and finished["duration_ms"] >= 0
    assert ("4111-SECRET" in proc.output()) is (log_payloads == "true")
