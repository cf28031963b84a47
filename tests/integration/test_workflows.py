"""Workflows end to end on a real instance: joins, maps, results to children, failure policies,
callbacks, cancel, retry from failure, reads and listings."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from taskmesh.errors import NonRetryableError
from taskmesh.services import retention
from taskmesh.tasks.models import TaskContext
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for
from tests.workflow_reads import ended, nodes_of, workflow

pytestmark = pytest.mark.anyio


async def _metrics_with(client: httpx.AsyncClient, line: str) -> str | None:
    text = (await client.get("/metrics")).text
    return text if line in text else None


async def test_a_diamond_hands_each_child_its_parents_results_and_joins_once(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    seen: dict[str, Any] = {}

    @registry.task("wf.step")
    async def step(payload: Any, ctx: TaskContext) -> Any:
        assert ctx.workflow is not None
        seen.setdefault(ctx.workflow["node"], []).append((dict(ctx.parents), ctx.workflow["context"]))
        return {"node": ctx.workflow["node"], "n": payload.get("n", 0)}

    body = {
        "name": "diamond",
        "context": {"run": 7},
        "nodes": [
            {"id": "a", "task": "wf.step", "payload": {"n": 1}},
            {"id": "b", "task": "wf.step", "payload": {"n": 2}, "deps": ["a"]},
            {"id": "c", "task": "wf.step", "payload": {"n": 3}, "deps": ["a"]},
            {"id": "d", "task": "wf.step", "deps": ["b", "c"]},
        ],
    }
    async with start_instance(metrics_sample_seconds=0.2) as inst, http(inst) as client:
        r = await client.post("/api/v1/workflows", json=body)
        assert r.status_code == 201, r.text
        created = r.json()
        assert created["status"] == "running" and set(created["nodes"]) == {"a", "b", "c", "d"}
        done = await ended(client, created["workflow_id"])
        join = (await client.get(f"/api/v1/tasks/{created['nodes']['d']}")).json()["task"]
        counted = 'taskmesh_workflows_ended_total{outcome="completed",workflow="diamond"} 1.0'
        metrics = await wait_for(lambda: _metrics_with(client, counted))
    assert 'taskmesh_workflows_submitted_total{workflow="diamond"} 1.0' in metrics
    assert (join["workflow_id"], join["workflow_node"], join["map_index"]) == (created["workflow_id"], "d", None)
    assert done["status"] == "completed"
    assert done["counts"] == {"completed": 4}
    assert {k: len(v) for k, v in seen.items()} == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert seen["d"][0] == ({"b": {"node": "b", "n": 2}, "c": {"node": "c", "n": 3}}, {"run": 7})
    assert seen["b"][0][0] == {"a": {"node": "a", "n": 1}}
    assert all(n["state"] == "succeeded" and n["waiting_for"] == [] for n in done["nodes"])


async def test_a_map_over_a_result_fans_out_and_its_join_gets_the_list_in_item_order(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    joined: list[Any] = []

    @registry.task("wf.extract")
    async def extract(payload: Any) -> list[int]:
        return list(range(25))

    @registry.task("wf.square")
    async def square(payload: int, ctx: TaskContext) -> int:
        await anyio.sleep(0.001 * (25 - payload))  # later items end first
        return payload * payload

    @registry.task("wf.sum")
    async def total(payload: Any, ctx: TaskContext) -> int:
        joined.append(ctx.parents["square"])
        return sum(ctx.parents["square"])

    body = {
        "name": "etl",
        "nodes": [
            {"id": "extract", "task": "wf.extract"},
            {"id": "square", "task": "wf.square", "deps": ["extract"], "map": {"from": "extract"}},
            {"id": "sum", "task": "wf.sum", "deps": ["square"]},
        ],
    }
    async with start_instance(worker_concurrency=8) as inst, http(inst) as client:
        created = (await client.post("/api/v1/workflows", json=body)).json()
        assert created["nodes"]["square"] == []
        done = await ended(client, created["workflow_id"])
    assert done["status"] == "completed", done
    assert joined == [[i * i for i in range(25)]]
    mapped = nodes_of(done)["square"]
    assert mapped["kind"] == "map" and mapped["counts"] == {"completed": 25} and len(mapped["task_ids"]) == 25


async def test_a_failed_dep_skips_its_descendants_runs_an_ignoring_child_and_the_callbacks_once(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ran: list[str] = []
    summaries: dict[str, Any] = {}

    @registry.task("wf.ok")
    async def ok(payload: Any, ctx: TaskContext) -> str:
        assert ctx.workflow is not None
        ran.append(ctx.workflow["node"])
        if ctx.workflow["node"] in ("on_failure", "finally"):
            summaries[ctx.workflow["node"]] = ctx.workflow["summary"]
        return "ok"

    @registry.task("wf.boom", max_retries=0)
    async def boom(payload: Any) -> None:
        raise NonRetryableError("upstream said no")

    @registry.task("wf.sees")
    async def sees(payload: Any, ctx: TaskContext) -> Any:
        ran.append("sees")
        return ctx.parents

    body = {
        "name": "policies",
        "nodes": [
            {"id": "a", "task": "wf.ok"},
            {"id": "bad", "task": "wf.boom", "deps": ["a"]},
            {"id": "after", "task": "wf.ok", "deps": ["bad"]},
            {"id": "later", "task": "wf.ok", "deps": ["after"]},
            {"id": "sees", "task": "wf.sees", "deps": ["bad", "a"], "on_dep_failure": "ignore"},
        ],
        "on_failure": {"task": "wf.ok"},
        "finally": {"task": "wf.ok"},
    }
    async with start_instance() as inst, http(inst) as client:
        created = (await client.post("/api/v1/workflows", json=body)).json()
        done = await ended(client, created["workflow_id"])
        sees_task = nodes_of(done)["sees"]["task_id"]
        runs = (await client.get(f"/api/v1/tasks/{sees_task}/runs")).json()["runs"]
    nodes = nodes_of(done)
    assert done["status"] == "failed"
    assert {k: n["state"] for k, n in nodes.items()} == {
        "a": "succeeded",
        "bad": "failed",
        "after": "skipped",
        "later": "skipped",
        "sees": "succeeded",
        "on_failure": "succeeded",
        "finally": "succeeded",
    }
    assert sorted(ran) == ["a", "finally", "on_failure", "sees"]
    assert runs[-1]["result"] == {"bad": None, "a": "ok"}
    assert summaries["on_failure"] == {
        "a": "succeeded",
        "bad": "failed",
        "after": "skipped",
        "later": "skipped",
        "sees": "succeeded",
    }
    assert nodes["bad"]["error"] == "NonRetryableError: upstream said no"  # its task's, in the workflow's read


async def test_retry_from_failure_reruns_only_what_failed_and_completes(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    runs: dict[str, int] = {}
    broken = {"yes": True}

    @registry.task("wf.count")
    async def count(payload: Any, ctx: TaskContext) -> str:
        assert ctx.workflow is not None
        node: str = ctx.workflow["node"]
        runs[node] = runs.get(node, 0) + 1
        if node == "flaky" and broken["yes"]:
            raise NonRetryableError("not yet")
        return node

    body = {
        "name": "retry-me",
        "nodes": [
            {"id": "first", "task": "wf.count"},
            {"id": "flaky", "task": "wf.count", "deps": ["first"]},
            {"id": "last", "task": "wf.count", "deps": ["flaky"]},
        ],
        "finally": {"task": "wf.count"},
    }
    async with start_instance() as inst, http(inst) as client:
        created = (await client.post("/api/v1/workflows", json=body)).json()
        wid = created["workflow_id"]
        failed = await ended(client, wid)
        broken["yes"] = False
        r = await client.post(f"/api/v1/workflows/{wid}/retry")
        done = await ended(client, wid)
        again = await client.post(f"/api/v1/workflows/{wid}/retry")
        too_late = await client.post(f"/api/v1/workflows/{wid}/cancel")
    assert failed["status"] == "failed"
    assert (r.status_code, r.json()) == (
        200,
        {"workflow_id": wid, "status": "running", "requeued": 1, "reblocked": 2},
    )
    assert done["status"] == "completed", done
    assert runs == {"first": 1, "flaky": 2, "last": 1, "finally": 2}  # finally: once per end
    assert again.status_code == 409
    assert again.json()["detail"] == f"workflow {wid} is completed; only a failed or cancelled workflow can be retried"
    assert (too_late.status_code, too_late.json()["detail"]) == (
        409,
        f"workflow {wid} is completed; it is over: there is nothing to cancel",
    )


async def test_cancel_ends_what_waits_and_stops_what_runs(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    started = anyio.Event()

    @registry.task("wf.slow")
    async def slow(payload: Any) -> None:
        started.set()
        await anyio.sleep(60)

    @registry.task("wf.never")
    async def never(payload: Any) -> None:
        raise AssertionError("a cancelled workflow's node ran")

    body = {
        "name": "cancel-me",
        "nodes": [
            {"id": "slow", "task": "wf.slow"},
            {"id": "next", "task": "wf.never", "deps": ["slow"], "on_dep_failure": "ignore"},
        ],
        "finally": {"task": "wf.never"},
    }
    async with start_instance(lease_seconds=3) as inst, http(inst) as client:
        created = (await client.post("/api/v1/workflows", json=body)).json()
        wid = created["workflow_id"]
        with anyio.fail_after(10):
            await started.wait()
        r = await client.post(f"/api/v1/workflows/{wid}/cancel", json={"reason": "wrong input"})
        assert r.status_code == 200, r.text
        assert (r.json()["cancelled"], r.json()["cancel_requested"]) == (2, 1)
        done = await ended(client, wid)
        again = await client.post(f"/api/v1/workflows/{wid}/cancel")
    assert done["status"] == "cancelled" and done["cancel_reason"] == "wrong input"
    assert done["counts"] == {"cancelled": 3}
    assert again.status_code == 200 and again.json()["cancelled"] == 0


async def test_a_workflow_and_its_tasks_leave_together_and_never_while_it_may_read_them(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, stores: Any
) -> None:
    @registry.task("wf.quick")
    async def quick(payload: Any) -> str:
        return "done"

    over = {"name": "over", "nodes": [{"id": "a", "task": "wf.quick"}, {"id": "b", "task": "wf.quick", "deps": ["a"]}]}
    live = {
        "name": "live",
        "nodes": [
            {"id": "a", "task": "wf.quick"},
            {"id": "wait", "task": "wf.quick", "queue_name": "parked", "deps": ["a"]},
        ],
    }
    async with start_instance() as inst, http(inst) as client:
        old = (await client.post("/api/v1/workflows", json=over)).json()["workflow_id"]
        running = (await client.post("/api/v1/workflows", json=live)).json()
        await ended(client, old)
        await wait_for(lambda: _node_state(client, running["workflow_id"], "a", "succeeded"))
    # as if everything ended long ago
    await pool.execute("UPDATE workflows SET finished_at = now() - interval '2 days' WHERE finished_at IS NOT NULL")
    await pool.execute("UPDATE tasks SET updated_at = now() - interval '2 days'")
    deleted = await retention.run_once(stores.pg, {"completed": 3600, "workflows": 86400})
    assert deleted == {"workflows": 1}
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE workflow_id = $1", uuid.UUID(old)) == 0
    assert await pool.fetchval("SELECT count(*) FROM workflow_nodes WHERE workflow_id = $1", uuid.UUID(old)) == 0
    # the live workflow's completed task stays: its child is handed its result when it runs
    live_a = uuid.UUID(running["nodes"]["a"])
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", live_a) == "completed"


async def _node_state(client: httpx.AsyncClient, workflow_id: str, node: str, state: str) -> bool:
    return bool(nodes_of(await workflow(client, workflow_id))[node]["state"] == state)


async def test_continue_runs_a_node_at_its_deps_first_failure_and_ignore_waits_for_every_dep(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    handed: dict[str, Any] = {}

    @registry.task("wf.fails", max_retries=0)
    async def fails(payload: Any) -> None:
        raise NonRetryableError("the card was declined")

    @registry.task("wf.handle")
    async def handle(payload: Any, ctx: TaskContext) -> None:
        assert ctx.workflow is not None
        handed[ctx.workflow["node"]] = dict(ctx.parents)

    never = {"task": "wf.fails", "queue_name": "parked"}  # a queue nobody serves: it never ends
    body = {
        "name": "policies",
        "nodes": [
            {"id": "charge", "task": "wf.fails"},
            {"id": "ship", **never},
            {"id": "refund", "task": "wf.handle", "deps": ["charge", "ship"], "on_dep_failure": "continue"},
            {"id": "report", "task": "wf.handle", "deps": ["charge", "ship"], "on_dep_failure": "ignore"},
        ],
    }
    async with start_instance() as inst, http(inst) as client:
        created = (await client.post("/api/v1/workflows", json=body)).json()
        await wait_for(lambda: _node_state(client, created["workflow_id"], "refund", "succeeded"))
        body_now = await workflow(client, created["workflow_id"])
        await client.post(f"/api/v1/workflows/{created['workflow_id']}/cancel")
    nodes = nodes_of(body_now)
    assert handed == {"refund": {"charge": None, "ship": None}}
    assert (nodes["report"]["state"], nodes["report"]["waiting_for"]) == ("blocked", ["ship"])
