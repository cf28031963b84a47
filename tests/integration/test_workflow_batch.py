"""Many workflows at once (``POST /api/v1/workflows:batch``, ``Workflows.submit_many``) on real stores:
one transaction for the whole batch, each item's outcome, dedup keys within a batch, against a stored
workflow and between concurrent batches, the batch's bounds, and the key's scope, tenant and queues."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest
from pydantic import BaseModel

from taskmesh.security import keys as api_keys
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.workflows.spec import parse_workflow
from taskmesh.workflows.workflows import Workflows
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

BATCH = "/api/v1/workflows:batch"


class Invoice(BaseModel):
    invoice_id: int


@pytest.fixture(autouse=True)
def handlers(registry: Registry) -> None:
    @registry.task("wfb.step")
    async def step(payload: Any) -> str:
        return "done"

    @registry.task("wfb.invoice")
    async def invoice(payload: Invoice) -> None:
        return None


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions")


def chain(doc: int, **extra: Any) -> dict[str, Any]:
    """``a -> b -> c`` for one document."""
    return {
        "name": "doc-chain",
        "nodes": [
            {"id": "a", "task": "wfb.step", "payload": {"doc": doc}},
            {"id": "b", "task": "wfb.step", "deps": ["a"]},
            {"id": "c", "task": "wfb.step", "deps": ["b"]},
        ],
        **extra,
    }


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def counts(pool: asyncpg.Pool) -> tuple[int, int]:
    """``(workflows, tasks)`` stored."""
    row = await pool.fetchrow("SELECT (SELECT count(*) FROM workflows) AS w, (SELECT count(*) FROM tasks) AS t")
    assert row is not None
    return row["w"], row["t"]


async def test_a_batch_of_chains_is_stored_in_one_transaction_and_every_chain_runs_to_its_end(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.post(BATCH, json={"workflows": [chain(d) for d in range(40)]})
        metrics = (await client.get("/metrics")).text
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["created"], body["deduplicated"], body["rejected"]) == (40, 0, 0)
    assert [x["index"] for x in body["results"]] == list(range(40))
    assert {x["status"] for x in body["results"]} == {"created"}
    assert all(set(x["nodes"]) == {"a", "b", "c"} for x in body["results"])
    assert 'taskmesh_workflows_submitted_total{workflow="doc-chain"} 40.0' in metrics
    # One transaction: every row it wrote carries its transaction id.
    xids = await pool.fetchval(
        "SELECT count(DISTINCT x) FROM (SELECT xmin::text AS x FROM workflows UNION ALL "
        "SELECT xmin::text FROM workflow_nodes UNION ALL SELECT xmin::text FROM workflow_edges UNION ALL "
        "SELECT xmin::text FROM tasks) s"
    )
    assert xids == 1
    roots = await pool.fetch("SELECT id, payload::text AS p FROM tasks WHERE workflow_node = 'a' AND status = 'queued'")
    assert len(roots) == 40
    first = body["results"][7]
    stored = await pool.fetchval("SELECT payload->>'doc' FROM tasks WHERE id = $1", uuid.UUID(first["nodes"]["a"]))
    assert stored == "7"  # each item's answer names its own tasks
    [event] = await pool.fetch("SELECT resource_type, details FROM audit_events WHERE action = 'workflow.create_batch'")
    assert event["resource_type"] == "workflow"
    assert '"created": 40' in event["details"] and '"deduplicated": 0' in event["details"]

    async with start_instance():

        async def all_over() -> bool:
            over: int = await pool.fetchval("SELECT count(*) FROM workflows WHERE status = 'completed'")
            return over == 40

        await wait_for(all_over, timeout=20)
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'completed'") == 120


async def test_a_dedup_key_taken_before_or_earlier_in_the_batch_answers_that_workflow_and_stores_nothing(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        before = (await client.post("/api/v1/workflows", json=chain(0, dedup_key="doc-0"))).json()
        r = await client.post(
            BATCH,
            json={
                "workflows": [
                    chain(0, dedup_key="doc-0"),
                    chain(1, dedup_key="doc-1"),
                    chain(2),
                    chain(1, dedup_key="doc-1"),
                    chain(0, dedup_key="doc-0"),
                    chain(3, dedup_key="doc-0", tenant_id="acme"),  # a key is unique per tenant
                ]
            },
        )
    assert r.status_code == 200, r.text
    body = r.json()
    results = body["results"]
    assert [x["status"] for x in results] == [
        "deduplicated",
        "created",
        "created",
        "deduplicated",
        "deduplicated",
        "created",
    ]
    assert (body["created"], body["deduplicated"], body["rejected"]) == (3, 3, 0)
    assert results[0]["workflow_id"] == results[4]["workflow_id"] == before["workflow_id"]
    assert results[0]["nodes"] == results[4]["nodes"] == before["nodes"]
    assert results[0]["trace_id"] == before["trace_id"]
    assert results[3]["workflow_id"] == results[1]["workflow_id"]
    assert results[3]["nodes"] == results[1]["nodes"] and results[3]["trace_id"] == results[1]["trace_id"]
    assert results[5]["workflow_id"] != before["workflow_id"]
    assert await counts(pool) == (4, 12)
    docs = await pool.fetch("SELECT payload->>'doc' AS doc FROM tasks WHERE workflow_node = 'a' ORDER BY 1")
    assert [d["doc"] for d in docs] == ["0", "1", "2", "3"]


async def test_concurrent_batches_sharing_dedup_keys_make_one_workflow_per_key(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    flows = Workflows(tasks)
    keys = [f"doc-{k}" for k in range(60)]
    batches = []
    for b in range(6):
        mine = random.Random(b).sample(keys, 40)  # overlapping, each in its own order
        batches.append([parse_workflow(chain(int(k[4:]), dedup_key=k)) for k in mine])
    answers: list[list[Any]] = [[] for _ in batches]

    async def submit(b: int) -> None:
        answers[b] = await flows.submit_many(batches[b])

    async with anyio.create_task_group() as tg:
        for b in range(len(batches)):
            tg.start_soon(submit, b)
    by_key: dict[str, set[uuid.UUID]] = {}
    created = 0
    for batch, out in zip(batches, answers, strict=True):
        for spec, answer in zip(batch, out, strict=True):
            assert spec.dedup_key is not None
            by_key.setdefault(spec.dedup_key, set()).add(answer.workflow_id)
            created += answer.created
    assert all(len(ids) == 1 for ids in by_key.values()), by_key
    stored = await pool.fetch("SELECT dedup_key, id FROM workflows")
    assert {r["dedup_key"]: {r["id"]} for r in stored} == by_key
    assert created == len(stored) == len(by_key)
    for out in answers:  # each batch's workflows in one transaction
        made = [a.workflow_id for a in out if a.created]
        xids = await pool.fetchval("SELECT count(DISTINCT xmin::text) FROM workflows WHERE id = ANY($1)", made)
        assert xids == (1 if made else 0)
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 3 * len(stored)


BAD_CYCLE = {
    "name": "bad",
    "nodes": [{"id": "a", "task": "wfb.step", "deps": ["b"]}, {"id": "b", "task": "wfb.step", "deps": ["a"]}],
}
BAD_PAYLOAD = {"name": "bad", "nodes": [{"id": "bill", "task": "wfb.invoice", "payload": {"invoice_id": "x"}}]}
CYCLE = "the deps form a cycle (each depends on the next): a -> b -> a"
NOT_AN_INTEGER = "Input should be a valid integer, unable to parse string as an integer"


async def test_a_bad_item_is_rejected_naming_its_field_and_the_others_are_stored(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.post(BATCH, json={"workflows": [chain(0), BAD_CYCLE, BAD_PAYLOAD, chain(1)]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["created"], body["deduplicated"], body["rejected"]) == (2, 0, 2)
    assert body["results"][1] == {
        "index": 1,
        "status": "rejected",
        "errors": [{"field": "workflows[1].nodes[0].deps", "message": CYCLE}],
    }
    assert body["results"][2] == {
        "index": 2,
        "status": "rejected",
        "errors": [{"field": "workflows[2].nodes[0].payload.invoice_id", "message": NOT_AN_INTEGER}],
    }
    assert [body["results"][i]["status"] for i in (0, 3)] == ["created", "created"]
    assert await counts(pool) == (2, 6)


async def test_an_atomic_batch_with_a_bad_item_is_refused_whole_and_stores_nothing(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.post(BATCH, json={"workflows": [chain(0), BAD_PAYLOAD, BAD_CYCLE], "atomic": True})
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["detail"] == (
        f"workflows[1].nodes[0].payload.invoice_id: {NOT_AN_INTEGER} (atomic batch: nothing stored)"
    )
    assert problem["errors"] == [
        {"field": "workflows[1].nodes[0].payload.invoice_id", "message": NOT_AN_INTEGER},
        {"field": "workflows[2].nodes[0].deps", "message": CYCLE},
    ]
    assert [x["status"] for x in problem["results"]] == ["not stored", "rejected", "rejected"]
    assert await counts(pool) == (0, 0)


@pytest.mark.parametrize(
    ("workflows", "message"),
    [
        ([chain(d) for d in range(1001)], "must be a list of 1 to 1000 workflows"),
        ([], "must be a list of 1 to 1000 workflows"),
        (
            [chain(0), chain(1), BAD_CYCLE],  # a bad item's nodes count too: the bound is the body's
            "8 nodes in all, more than the workflow_max_nodes setting (7): send smaller batches",
        ),
    ],
    ids=["too many workflows", "none", "too many nodes in all"],
)
async def test_a_batch_over_its_bounds_is_refused_naming_workflows_and_stores_nothing(
    start_instance: Any, pool: asyncpg.Pool, workflows: list[dict[str, Any]], message: str
) -> None:
    async with start_instance(workers_enabled=False, workflow_max_nodes=7) as inst, http(inst) as client:
        r = await client.post(BATCH, json={"workflows": workflows})
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [{"field": "workflows", "message": message}]
    assert r.json()["detail"] == f"workflows: {message}"
    assert await counts(pool) == (0, 0)


async def test_a_key_without_tasks_write_is_refused(start_instance: Any, stores: Any, pool: asyncpg.Pool) -> None:
    reader = (await api_keys.create(stores.pg, "reader", ["tasks:read", "tasks:cancel"])).key
    writer = (await api_keys.create(stores.pg, "writer", ["tasks:write"])).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        refused = await client.post(BATCH, json={"workflows": [chain(0)]}, headers=bearer(reader))
        assert await counts(pool) == (0, 0)
        allowed = await client.post(BATCH, json={"workflows": [chain(0)]}, headers=bearer(writer))
    assert refused.status_code == 403
    assert refused.json()["detail"] == "this key lacks the scope 'tasks:write'"
    assert allowed.status_code == 200, allowed.text


async def test_a_tenant_keys_batch_goes_into_its_tenant_and_naming_another_is_refused_whole(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    acme = (await api_keys.create(stores.pg, "acme", ["tasks:read", "tasks:write"], tenant_id="acme")).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        other = await client.post(
            BATCH, json={"workflows": [chain(0), chain(1, tenant_id="globex")]}, headers=bearer(acme)
        )
        assert await counts(pool) == (0, 0)
        own = await client.post(BATCH, json={"workflows": [chain(0), chain(1, tenant_id="acme")]}, headers=bearer(acme))
    assert other.status_code == 403
    assert other.json()["errors"] == [
        {
            "field": "workflows[1].tenant_id",
            "message": "this key is bound to tenant 'acme'; it cannot create workflows of tenant 'globex'",
        }
    ]
    assert own.status_code == 200 and own.json()["created"] == 2, own.text
    tenants = await pool.fetch("SELECT DISTINCT tenant_id FROM workflows UNION SELECT DISTINCT tenant_id FROM tasks")
    assert [r["tenant_id"] for r in tenants] == ["acme"]


async def test_a_queue_bound_keys_batch_is_refused_for_a_node_on_another_queue(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    key = (await api_keys.create(stores.pg, "reports", ["tasks:write"], queues=["reports"])).key
    on_reports = chain(0, queue_name="reports")
    elsewhere = {**chain(1, queue_name="reports"), "finally": {"task": "wfb.step", "queue_name": "billing"}}
    async with start_instance(workers_enabled=False, queue_names=["reports"]) as inst, http(inst) as client:
        refused = await client.post(BATCH, json={"workflows": [on_reports, elsewhere]}, headers=bearer(key))
        assert await counts(pool) == (0, 0)
        allowed = await client.post(BATCH, json={"workflows": [on_reports]}, headers=bearer(key))
    assert refused.status_code == 403
    assert refused.json()["errors"] == [
        {"field": "workflows[1].finally.queue_name", "message": "this key cannot create tasks on queue 'billing'"}
    ]
    assert allowed.status_code == 200 and allowed.json()["created"] == 1, allowed.text
    assert await pool.fetchval("SELECT array_agg(DISTINCT queue) FROM tasks") == ["reports"]


async def test_a_tenants_payload_quota_counts_every_item_naming_the_node(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    quotas = {"tenant_quotas": {"acme": {"max_payload_bytes": 20}}}
    big = chain(0, tenant_id="acme")
    big["nodes"][1]["payload"] = {"text": "x" * 30}
    async with start_instance(workers_enabled=False, **quotas) as inst, http(inst) as client:
        r = await client.post(BATCH, json={"workflows": [chain(1, tenant_id="acme"), big]})
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == (
        "workflows[1].nodes[1].payload: 41 bytes as JSON; tenant 'acme' has a max_payload_bytes quota of 20"
    )
    assert await counts(pool) == (0, 0)


async def test_a_tenants_enqueue_rate_counts_the_tasks_of_every_item_together(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    quotas = {"tenant_quotas": {"acme": {"enqueue_per_second": 2}}}  # bursts of 4 tasks: one chain fits
    async with start_instance(workers_enabled=False, **quotas) as inst, http(inst) as client:
        r = await client.post(BATCH, json={"workflows": [chain(0, tenant_id="acme"), chain(1, tenant_id="acme")]})
    assert r.status_code == 429, r.text
    assert r.json()["detail"] == (
        "6 tasks at once are more than tenant 'acme' may ever create at once (4, from its enqueue_per_second "
        "quota of 2): send smaller batches"
    )
    assert await counts(pool) == (0, 0)
