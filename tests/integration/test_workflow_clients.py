"""The Python clients' workflows: build, submit, read, list, cancel and retry, against a real instance.

The async client's answers are the HTTP API's for the same workflow; its refusals are the API's
422s (field and message), before anything is written; the sync client does the same, blocking.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import anyio
import asyncpg
import pytest

import taskmesh
from taskmesh.errors import InvalidTaskError, NonRetryableError, WorkflowNotFoundError, WorkflowStateError
from taskmesh.tasks.registry import Registry
from tests.conftest import REDIS_MODE, http, wait_for

pytestmark = pytest.mark.anyio


@dataclass
class Resize:
    width: int


def register(registry: Registry) -> None:
    @registry.task("wf.items")
    async def items(payload: Any) -> list[int]:
        return [1, 2, 3]

    @registry.task("wf.double")
    async def double(payload: int) -> int:
        return payload * 2

    @registry.task("wf.sum")
    async def total(payload: Any, ctx: Any) -> int:
        return sum(ctx.parents["each"])

    @registry.task("wf.fail", max_retries=0)
    async def fail(payload: Any) -> None:
        raise NonRetryableError("no")

    @registry.task("wf.resize")
    async def resize(payload: Resize) -> int:
        return payload.width

    @registry.task("wf.hold")
    async def hold(payload: Any) -> None:
        await anyio.sleep(60)


def client(database_url: str, redis_url: str, prefix: str, registry: Registry) -> taskmesh.Client:
    return taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=registry)


async def until(c: taskmesh.Client, ref: Any, status: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        wf = await c.get_workflow(ref)
        return wf if wf["status"] == status else None

    answer: dict[str, Any] = await wait_for(check, timeout=20)
    return answer


async def test_the_client_submits_reads_lists_and_deduplicates_a_workflow_as_the_api_answers(
    database_url: str, redis_url: str, prefix: str, start_instance: Any, registry: Registry
) -> None:
    register(registry)
    async with start_instance() as inst, client(database_url, redis_url, prefix, registry) as c, http(inst) as api:
        builder = (
            c.workflow("fanout", dedup_key="day-1", context={"day": 1})
            .task("src", "wf.items")
            .map("each", "wf.double", from_="src")
            .task("sum", "wf.sum", deps=["each"])
        )
        answer = await builder.submit()
        assert (answer["status"], answer["nodes"]["each"]) == ("running", [])
        assert set(answer["nodes"]) == {"src", "each", "sum"} and "deduplicated" not in answer
        uuid.UUID(answer["nodes"]["src"])

        wf = await until(c, answer, "completed")
        assert wf == (await api.get(f"/api/v1/workflows/{answer['workflow_id']}")).json()
        assert (wf["context"], wf["counts"]) == ({"day": 1}, {"completed": 5})
        _task, run = await c.get(wf["nodes"][2]["task_id"])
        assert run is not None and run["result"] == 12

        again = await builder.submit()
        assert again == {
            **answer,
            "status": "completed",
            "deduplicated": True,
            # the first one's tasks as they are now: the map over src's result has made its three
            "nodes": {**answer["nodes"], "each": [str(i) for i in wf["nodes"][1]["task_ids"]]},
        }
        assert len(again["nodes"]["each"]) == 3

        other = await c.workflow("other").task("a", "wf.items").submit()
        await until(c, other["workflow_id"], "completed")
        page = await c.list_workflows()
        assert page == (await api.get("/api/v1/workflows")).json()
        assert [w["workflow_id"] for w in page["workflows"]] == [other["workflow_id"], answer["workflow_id"]]
        assert [w["name"] for w in (await c.list_workflows(name="fanout"))["workflows"]] == ["fanout"]
        assert (await c.list_workflows(status="running"))["workflows"] == []
        first = await c.list_workflows(limit=1, created_after="2000-01-01T00:00:00Z")
        assert [w["workflow_id"] for w in first["workflows"]] == [other["workflow_id"]]
        rest = await c.list_workflows(limit=1, cursor=first["next_cursor"])
        assert ([w["workflow_id"] for w in rest["workflows"]], rest["next_cursor"]) == ([answer["workflow_id"]], None)


BAD_BODIES: list[dict[str, Any]] = [
    {"name": "bad name", "nodes": [{"id": "a", "task": "wf.items"}]},
    {
        "name": "cycle",
        "nodes": [{"id": "a", "task": "wf.items", "deps": ["b"]}, {"id": "b", "task": "wf.items", "deps": ["a"]}],
    },
    {"name": "dup", "nodes": [{"id": "a", "task": "wf.items"}, {"id": "a", "task": "wf.items"}]},
    {"name": "unknown", "nodes": [{"id": "a", "task": "wf.items", "deps": ["x"]}]},
    {
        "name": "map-src",
        "nodes": [{"id": "a", "task": "wf.items"}, {"id": "m", "task": "wf.double", "map": {"from": "a"}}],
    },
    {"name": "payload", "nodes": [{"id": "a", "task": "wf.resize", "payload": {"width": "wide"}}]},
    {"name": "item", "nodes": [{"id": "m", "task": "wf.resize", "map": [{"width": 1}, {"width": "wide"}]}]},
]


async def test_the_client_refuses_a_bad_workflow_with_the_apis_field_and_message_and_writes_nothing(
    database_url: str, redis_url: str, prefix: str, start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    register(registry)
    async with start_instance() as inst, client(database_url, redis_url, prefix, registry) as c, http(inst) as api:
        for body in BAD_BODIES:
            refused = await api.post("/api/v1/workflows", json=body)
            assert refused.status_code == 422, (body, refused.text)
            with pytest.raises(InvalidTaskError) as info:
                await c.submit_workflow(body)
            assert [info.value.field, info.value.message] == [
                refused.json()["errors"][0]["field"],
                refused.json()["errors"][0]["message"],
            ], body
        # The builder refuses the same graphs before sending, in the same words.
        with pytest.raises(InvalidTaskError) as info:
            c.workflow("dup").task("a", "wf.items").task("a", "wf.items")
        assert str(info.value) == "nodes[1].id: duplicate node id 'a' (also nodes[0])"
        with pytest.raises(InvalidTaskError) as info:
            await c.workflow("unknown").task("a", "wf.items", deps=["x"]).submit()
        assert str(info.value) == "nodes[0].deps: node 'a' depends on 'x', which is no node"
        with pytest.raises(InvalidTaskError) as info:
            await c.list_workflows(status="bogus")
        assert str(info.value) == "status: must be one of running, completed, failed, cancelled"
        with pytest.raises(InvalidTaskError) as info:
            await c.list_workflows(created_before="yesterday")
        assert str(info.value) == "created_before: must be an RFC 3339 time with an offset"
        with pytest.raises(InvalidTaskError) as info:
            await c.get_workflow("nope")
        assert str(info.value) == "workflow_id: must be a UUID"
    assert await pool.fetchval("SELECT count(*) FROM workflows") == 0
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_the_client_cancels_and_retries_a_workflow_and_raises_for_a_state_that_refuses(
    database_url: str, redis_url: str, prefix: str, start_instance: Any, registry: Registry
) -> None:
    register(registry)
    async with start_instance(), client(database_url, redis_url, prefix, registry) as c:
        held = await c.workflow("held").task("hold", "wf.hold").task("next", "wf.items", deps=["hold"]).submit()

        async def holding() -> bool:
            return bool((await c.get_workflow(held))["counts"].get("running"))

        await wait_for(holding)
        with pytest.raises(InvalidTaskError) as info:
            await c.cancel_workflow(held, reason="x" * 501)
        assert info.value.field == "reason"
        cancelled = await c.cancel_workflow(held["workflow_id"], reason="wrong input")
        assert cancelled == {
            "workflow_id": held["workflow_id"],
            "status": "cancelled",
            "cancelled": 1,
            "cancel_requested": 1,
        }
        wf = await c.get_workflow(uuid.UUID(held["workflow_id"]))
        assert (wf["status"], wf["cancel_reason"]) == ("cancelled", "wrong input")

        broken = await c.workflow("broken").task("bad", "wf.fail").task("after", "wf.items", deps=["bad"]).submit()
        await until(c, broken, "failed")
        assert await c.retry_workflow(broken) == {
            "workflow_id": broken["workflow_id"],
            "status": "running",
            "requeued": 1,
            "reblocked": 1,
        }

        done = await c.workflow("done").task("a", "wf.items").submit()
        await until(c, done, "completed")
        with pytest.raises(WorkflowStateError):
            await c.cancel_workflow(done)
        with pytest.raises(WorkflowStateError):
            await c.retry_workflow(done)
        missing = uuid.uuid4()
        with pytest.raises(WorkflowNotFoundError) as found:
            await c.get_workflow(missing)
        assert str(found.value) == f"no workflow has id {missing}"


async def test_the_sync_client_builds_submits_and_follows_a_workflow_blocking(
    database_url: str, redis_url: str, prefix: str, start_instance: Any, registry: Registry
) -> None:
    register(registry)

    def script() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        with taskmesh.SyncClient(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as c:
            answer = c.workflow("sync-fanout", context=[1]).map("each", "wf.double", [1, 2]).submit()
            deadline = time.monotonic() + 20
            while (wf := c.get_workflow(answer))["status"] != "completed" and time.monotonic() < deadline:
                time.sleep(0.05)
            page = c.list_workflows(name="sync-fanout", limit=5)
            with pytest.raises(WorkflowStateError):
                c.retry_workflow(answer["workflow_id"])
            with pytest.raises(WorkflowStateError):
                c.cancel_workflow(answer, reason="too late")
            with pytest.raises(InvalidTaskError):
                c.workflow("bad").task("a", "wf.items", deps=["b"]).submit()
        return answer, wf, page

    async with start_instance():
        answer, wf, page = await anyio.to_thread.run_sync(script)
    assert (wf["status"], wf["counts"], wf["context"]) == ("completed", {"completed": 2}, [1])
    assert len(answer["nodes"]["each"]) == 2 and wf["nodes"][0]["task_ids"] == answer["nodes"]["each"]
    assert [w["workflow_id"] for w in page["workflows"]] == [answer["workflow_id"]]


async def test_the_clients_submit_many_built_workflows_at_once_as_the_batch_route_stores_them(
    database_url: str, redis_url: str, prefix: str, start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    register(registry)

    def built(c: taskmesh.Client | taskmesh.SyncClient, doc: int) -> dict[str, Any]:
        return (
            c.workflow("doc", dedup_key=f"doc-{doc}")
            .task("a", "wf.resize", {"width": doc})
            .task("b", "wf.items", deps=["a"])
            .to_json()
        )

    async with start_instance(), client(database_url, redis_url, prefix, registry) as c:
        before = await c.submit_workflow(built(c, 0))
        answers = await c.submit_workflows([built(c, d) for d in (0, 1, 2, 1)])
        assert answers[0] == {**before, "status": answers[0]["status"], "deduplicated": True}  # it may be over
        assert [a.get("deduplicated", False) for a in answers] == [True, False, False, True]
        assert answers[3] == {**answers[1], "deduplicated": True}
        assert all(set(a["nodes"]) == {"a", "b"} for a in answers)
        assert [a["status"] for a in answers[1:]] == ["running"] * 3
        for answer in answers:
            await until(c, answer, "completed")
        _task, run = await c.get(answers[2]["nodes"]["a"])
        assert run is not None and run["result"] == 2

        bad = [built(c, 5), {"name": "w", "nodes": [{"id": "a", "task": "wf.resize", "payload": {"width": "x"}}]}]
        with pytest.raises(InvalidTaskError) as info:
            await c.submit_workflows(bad)
        assert str(info.value) == (
            "workflows[1].nodes[0].payload.width: Input should be a valid integer, unable to parse string as an integer"
        )
        with pytest.raises(InvalidTaskError) as info:
            await c.submit_workflows([built(c, 6), {"name": "w", "nodes": []}])
        assert str(info.value) == "workflows[1].nodes: List should have at least 1 item after validation, not 0"
    assert await pool.fetchval("SELECT count(*) FROM workflows") == 3  # the refused batches stored nothing

    def script() -> list[dict[str, Any]]:
        with taskmesh.SyncClient(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as s:
            return s.submit_workflows([built(s, 7), built(s, 1)])

    synced = await anyio.to_thread.run_sync(script)
    assert [a.get("deduplicated", False) for a in synced] == [False, True]
    assert synced[1]["workflow_id"] == answers[1]["workflow_id"]
    assert await pool.fetchval("SELECT count(*) FROM workflows") == 4
