"""Bad workflows get the exact problem naming the node, and write nothing; bad results fail one node, not the
instance."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from taskmesh.tasks.models import TaskContext
from taskmesh.tasks.registry import Registry
from tests.conftest import http
from tests.workflow_reads import ended, nodes_of

pytestmark = pytest.mark.anyio


class Invoice(BaseModel):
    invoice_id: int


def node(node_id: str, **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "task": "wf.plain", **extra}


CASES: list[tuple[str, dict[str, Any], int, str, str]] = [
    (
        "a cycle",
        {"name": "w", "nodes": [node("a", deps=["c"]), node("b", deps=["a"]), node("c", deps=["b"])]},
        422,
        "nodes[0].deps",
        "the deps form a cycle (each depends on the next): a -> c -> b -> a",
    ),
    (
        "an unknown dep",
        {"name": "w", "nodes": [node("a"), node("b", deps=["a", "ghost"])]},
        422,
        "nodes[1].deps",
        "node 'b' depends on 'ghost', which is no node",
    ),
    (
        "a map from no node, named among its deps",
        {"name": "w", "nodes": [node("a"), node("m", deps=["a", "ghost"], map={"from": "ghost"})]},
        422,
        "nodes[1].map.from",
        "node 'm' maps over 'ghost', which is no node",
    ),
    (
        "a map from no node",
        {"name": "w", "nodes": [node("a"), node("m", map={"from": "ghost"})]},
        422,
        "nodes[1].map.from",
        "node 'm' maps over 'ghost', which is no node",
    ),
    (
        "a duplicate id",
        {"name": "w", "nodes": [node("a"), node("a")]},
        422,
        "nodes[1].id",
        "duplicate node id 'a' (also nodes[0])",
    ),
    (
        "a node on itself",
        {"name": "w", "nodes": [node("a", deps=["a"])]},
        422,
        "nodes[0].deps",
        "node 'a' depends on itself",
    ),
    (
        "too many nodes",
        {"name": "w", "nodes": [node(f"n{i}") for i in range(6)]},
        422,
        "nodes",
        "6 nodes, more than the workflow_max_nodes setting (5)",
    ),
    (
        "a map too long",
        {"name": "w", "nodes": [node("m", map=list(range(4)))]},
        422,
        "nodes[0].map",
        "node 'm' maps over 4 items, more than the workflow_map_max_items setting (3)",
    ),
    (
        "a map from a node not among its deps",
        {"name": "w", "nodes": [node("a"), node("m", map={"from": "a"})]},
        422,
        "nodes[1].map.from",
        "node 'm' maps over 'a', which must be one of its deps",
    ),
    (
        "a payload the handler's model refuses",
        {"name": "w", "nodes": [{"id": "bill", "task": "wf.invoice", "payload": {"invoice_id": "x"}}]},
        422,
        "nodes[0].payload.invoice_id",
        "Input should be a valid integer, unable to parse string as an integer",
    ),
    (
        "a map item the handler's model refuses",
        {"name": "w", "nodes": [{"id": "bills", "task": "wf.invoice", "map": [{"invoice_id": 1}, {"id": 2}]}]},
        422,
        "nodes[0].map[1].invoice_id",
        "Field required",
    ),
    (
        "a reserved id",
        {"name": "w", "nodes": [node("finally")]},
        422,
        "nodes[0].id",
        "'finally' is the id of the workflow's finally callback",
    ),
    (
        "a map of the wrong shape",
        {"name": "w", "nodes": [node("m", map=5)]},
        422,
        "nodes[0].map",
        'must be a list of items or {"from": "<node id>"}',
    ),
    ("no nodes", {"name": "w", "nodes": []}, 422, "nodes", "List should have at least 1 item after validation, not 0"),
    ("an unknown field", {"name": "w", "nodes": [node("a", colour="red")]}, 422, "nodes[0].colour", "unknown field"),
    (
        "a bad policy",
        {"name": "w", "nodes": [node("a", on_dep_failure="sometimes")]},
        422,
        "nodes[0].on_dep_failure",
        "Input should be 'fail', 'ignore' or 'continue'",
    ),
]


@pytest.mark.parametrize(("case", "body", "status", "field", "detail"), CASES, ids=[c[0] for c in CASES])
async def test_a_bad_workflow_gets_its_exact_problem_and_writes_nothing(
    start_instance: Any,
    registry: Registry,
    pool: asyncpg.Pool,
    case: str,
    body: dict[str, Any],
    status: int,
    field: str,
    detail: str,
) -> None:
    @registry.task("wf.invoice")
    async def invoice(payload: Invoice) -> None:
        return None

    async with start_instance(workflow_max_nodes=5, workflow_map_max_items=3, workers_enabled=False) as inst:
        async with http(inst) as client:
            r = await client.post("/api/v1/workflows", json=body)
    assert r.status_code == status, r.text
    problem = r.json()
    assert (problem["errors"][0]["field"], problem["errors"][0]["message"]) == (field, detail)
    assert problem["detail"] == f"{field}: {detail}"
    assert await pool.fetchval("SELECT count(*) FROM workflows") == 0
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_a_map_over_a_result_that_is_not_a_list_fails_that_node_with_a_clear_error(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    @registry.task("wf.extract")
    async def extract(payload: Any) -> dict[str, int]:
        return {"rows": 3}

    @registry.task("wf.plain")
    async def plain(payload: Any) -> None:
        return None

    body = {
        "name": "not-a-list",
        "nodes": [
            {"id": "extract", "task": "wf.extract"},
            {"id": "each", "task": "wf.plain", "deps": ["extract"], "map": {"from": "extract"}},
            {"id": "after", "task": "wf.plain", "deps": ["each"]},
        ],
    }
    async with start_instance() as inst, http(inst) as client:
        wid = (await client.post("/api/v1/workflows", json=body)).json()["workflow_id"]

        done = await ended(client, wid)
    nodes = nodes_of(done)
    assert done["status"] == "failed"
    assert (nodes["each"]["status"], nodes["each"]["error"]) == (
        "failed",
        "map.from: node 'extract' returned object, not a list",
    )
    assert nodes["after"]["state"] == "skipped"


async def test_results_over_the_bound_fail_the_child_naming_the_setting(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    @registry.task("wf.big")
    async def big(payload: Any) -> str:
        return "x" * 3000

    ran: list[Any] = []

    @registry.task("wf.child", max_retries=0)
    async def child(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.parents)

    body = {
        "name": "big",
        "nodes": [{"id": "big", "task": "wf.big"}, {"id": "child", "task": "wf.child", "deps": ["big"]}],
    }
    async with start_instance(workflow_parents_max_bytes=2048) as inst, http(inst) as client:
        created = (await client.post("/api/v1/workflows", json=body)).json()

        done = await ended(client, created["workflow_id"])
        runs = (await client.get(f"/api/v1/tasks/{created['nodes']['child']}/runs")).json()["runs"]
    assert done["status"] == "failed" and ran == []
    assert runs[-1]["error"] == (
        "the results of this task's deps hold 3002 bytes, more than the workflow_parents_max_bytes setting (2048): "
        "return less from them (a key into storage)"
    )


async def test_a_map_over_a_result_past_the_bound_runs_each_item_not_handed_the_whole_list(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    @registry.task("wf.rows")
    async def rows(payload: Any) -> list[str]:
        return [f"{i:03d}" + "r" * 197 for i in range(20)]  # 4,120 bytes as JSON: twice the bound below

    handed: list[Any] = []

    @registry.task("wf.row", max_retries=0)
    async def row(payload: str, ctx: TaskContext) -> int:
        handed.append(ctx.parents)
        return int(payload[:3])

    @registry.task("wf.count", max_retries=0)
    async def count(payload: Any, ctx: TaskContext) -> int:
        return len(ctx.parents["row"])

    body = {
        "name": "wide",
        "nodes": [
            {"id": "rows", "task": "wf.rows"},
            {"id": "row", "task": "wf.row", "deps": ["rows"], "map": {"from": "rows"}},
            {"id": "count", "task": "wf.count", "deps": ["row"]},
        ],
    }
    async with start_instance(workflow_parents_max_bytes=2048) as inst, http(inst) as client:
        created = (await client.post("/api/v1/workflows", json=body)).json()

        done = await ended(client, created["workflow_id"])
    assert done["status"] == "completed", done
    assert handed == [{}] * 20
