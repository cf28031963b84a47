"""Acting on one task: retry a failed or cancelled one, delete a finished one.

``POST /api/v1/tasks/{id}/retry`` queues a failed or cancelled task again, due
now, with a fresh retry budget and optionally a new priority or queue; its next
run is a new attempt and a failed one leaves the DLQ. ``DELETE
/api/v1/tasks/{id}`` deletes a finished task and its runs. Any other state
answers 409 saying what to do; bad input gets its exact problem.
"""

from __future__ import annotations

import functools
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from taskmesh.errors import NonRetryableError
from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for
from tests.integration.test_api_bad_input import Bad, assert_problem, ge, invalid, no_errors

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"
WHY = {"reason": "cleanup after INC-7"}
NOT_RETRYABLE = "only a failed or cancelled task can be retried"
NOT_DELETABLE = "only a finished task can be deleted: cancel it first (POST /api/v1/tasks/{id}/cancel)"


def register(registry: Registry) -> dict[str, int]:
    """``actions.flaky`` fails for good on its first attempt and succeeds after; ``actions.ok`` succeeds."""
    calls = {"flaky": 0, "ok": 0}

    @registry.task("actions.flaky", max_retries=0)
    async def flaky(payload: Any, ctx: Any) -> int:
        calls["flaky"] += 1
        if ctx.attempt == 1:
            raise NonRetryableError("the report service was down")
        return int(ctx.attempt)

    @registry.task("actions.ok")
    async def ok(payload: Any) -> str:
        calls["ok"] += 1
        return "ok"

    return calls


async def create(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    r = await client.post(TASKS, json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["task_id"])


async def snapshot(client: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get(f"{TASKS}/{task_id}")).json()
    return body


async def reached(client: httpx.AsyncClient, task_id: str, status: str) -> dict[str, Any] | None:
    body = await snapshot(client, task_id)
    return body if body["task"]["status"] == status else None


async def test_a_failed_task_retried_with_a_new_priority_leaves_the_dlq_and_completes_on_its_next_attempt(
    start_instance: Any, registry: Registry, redis_client: aioredis.Redis, keys: Keys
) -> None:
    calls = register(registry)
    async with start_instance() as inst, http(inst) as client:
        task_id = await create(client, {"name": "actions.flaky", "priority": 2})
        await wait_for(lambda: reached(client, task_id, "failed"))
        await wait_for(lambda: _in_dlq(redis_client, keys, task_id))
        r = await client.post(f"{TASKS}/{task_id}/retry", json={"priority": 7})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "task_id": task_id,
            "status": "queued",
            "queue_name": "default",
            "priority": 7,
            "previous_status": "failed",
        }
        assert await redis_client.zrange(keys.dlq("default"), 0, -1) == []  # at once, not at the next sweep
        done = await wait_for(lambda: reached(client, task_id, "completed"))
        assert (done["task"]["priority"], done["task"]["retries"], done["task"]["attempts"]) == (7, 0, 2)
        assert (done["latest_run"]["attempt"], done["latest_run"]["result"]) == (2, 2)
        runs = (await client.get(f"{TASKS}/{task_id}/runs")).json()["runs"]
        assert [(run["attempt"], run["status"]) for run in runs] == [(1, "failed"), (2, "succeeded")]
    assert await redis_client.zrange(keys.dlq("default"), 0, -1) == []
    assert calls["flaky"] == 2


async def test_a_cancelled_task_retried_into_another_queue_runs_there_as_a_new_attempt(
    start_instance: Any, registry: Registry
) -> None:
    calls = register(registry)
    async with start_instance(queue_names=["default", "later"]) as inst, http(inst) as client:
        task_id = await create(client, {"name": "actions.ok", "delay_seconds": 3600})
        assert (await client.post(f"{TASKS}/{task_id}/cancel")).json()["status"] == "cancelled"
        r = await client.post(f"{TASKS}/{task_id}/retry", json={"queue_name": "later"})
        assert r.status_code == 200, r.text
        assert (r.json()["queue_name"], r.json()["previous_status"]) == ("later", "cancelled")
        done = await wait_for(lambda: reached(client, task_id, "completed"))
        assert done["task"]["queue_name"] == "later"
        runs = (await client.get(f"{TASKS}/{task_id}/runs")).json()["runs"]
    # The queued run the cancel ended stays as it was; the retry ran as attempt 2.
    assert [(run["attempt"], run["status"], run["error"]) for run in runs] == [
        (1, "failed", "cancelled"),
        (2, "succeeded", None),
    ]
    assert calls["ok"] == 1


async def test_retry_and_delete_of_a_task_in_the_wrong_state_answer_409_saying_what_to_do(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    register(registry)
    async with start_instance() as inst, http(inst) as client:
        queued = await create(client, {"name": "actions.ok", "delay_seconds": 3600})
        completed = await create(client, {"name": "actions.ok"})
        await wait_for(lambda: reached(client, completed, "completed"))
        answers = {
            ("retry", "queued"): await client.post(f"{TASKS}/{queued}/retry"),
            ("retry", "completed"): await client.post(f"{TASKS}/{completed}/retry"),
            ("delete", "queued"): await client.delete(f"{TASKS}/{queued}", params=WHY),
        }
        await pool.execute("UPDATE tasks SET status = 'running' WHERE id = $1", queued)
        answers[("retry", "running")] = await client.post(f"{TASKS}/{queued}/retry")
        answers[("delete", "running")] = await client.delete(f"{TASKS}/{queued}", params=WHY)
    for (action, status), r in answers.items():
        task_id = completed if status == "completed" else queued
        hint = NOT_RETRYABLE if action == "retry" else NOT_DELETABLE
        bad = Bad(
            f"{action} of a {status} task",
            "POST",
            "",
            409,
            "Task state conflict",
            f"task {task_id} is {status}; {hint}",
            None,
            None,
        )
        assert_problem(r, bad)
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 2


async def test_deleting_finished_tasks_removes_them_their_runs_and_their_dlq_entry(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    register(registry)
    async with start_instance() as inst, http(inst) as client:
        completed = await create(client, {"name": "actions.ok"})
        failed = await create(client, {"name": "actions.flaky"})
        cancelled = await create(client, {"name": "actions.ok", "delay_seconds": 3600})
        await client.post(f"{TASKS}/{cancelled}/cancel")
        await wait_for(lambda: reached(client, completed, "completed"))
        await wait_for(lambda: reached(client, failed, "failed"))
        await wait_for(lambda: _in_dlq(redis_client, keys, failed))
        for task_id in (completed, failed, cancelled):
            r = await client.delete(f"{TASKS}/{task_id}", params=WHY)
            assert (r.status_code, r.content) == (204, b""), r.text
            assert (await client.get(f"{TASKS}/{task_id}")).status_code == 404
        assert await redis_client.zrange(keys.dlq("default"), 0, -1) == []  # at once, not at the next sweep
        again = await client.delete(f"{TASKS}/{completed}", params=WHY)
        assert_problem(
            again, no_errors("delete twice", "DELETE", "", 404, "Task not found", f"no task has id {completed}")
        )
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0
    assert await pool.fetchval("SELECT count(*) FROM task_runs") == 0
    assert await redis_client.zrange(keys.dlq("default"), 0, -1) == []


RETRY = f"{TASKS}/{UNKNOWN_ID}/retry"
NO_REASON = "required to delete a task (?reason=...): kept in the audit log"
NAME_PATTERN = "String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'"
BAD_ACTIONS = [
    no_errors("retry of an unknown task", "POST", RETRY, 404, "Task not found", f"no task has id {UNKNOWN_ID}"),
    no_errors(
        "delete of an unknown task",
        "DELETE",
        f"{TASKS}/{UNKNOWN_ID}?reason=cleanup",
        404,
        "Task not found",
        f"no task has id {UNKNOWN_ID}",
    ),
    invalid("retry of a task id that is no uuid", "POST", f"{TASKS}/nope/retry", "task_id", "must be a UUID"),
    invalid("delete of a task id that is no uuid", "DELETE", f"{TASKS}/nope", "task_id", "must be a UUID"),
    invalid("delete without a reason", "DELETE", f"{TASKS}/{UNKNOWN_ID}", "reason", NO_REASON),
    invalid("delete with a blank reason", "DELETE", f"{TASKS}/{UNKNOWN_ID}?reason=%20%20", "reason", NO_REASON),
    invalid(
        "delete with a reason too long",
        "DELETE",
        f"{TASKS}/{UNKNOWN_ID}?reason={'x' * 501}",
        "reason",
        "at most 500 characters, not 501",
    ),
    invalid(
        "delete with a NUL in its reason",
        "DELETE",
        f"{TASKS}/{UNKNOWN_ID}?reason=a%00b",
        "reason",
        "contains a NUL character",
    ),
    invalid("retry priority -1", "POST", RETRY, "priority", ge(0), json={"priority": -1}),
    invalid(
        "retry priority a string", "POST", RETRY, "priority", "Input should be a valid integer", json={"priority": "7"}
    ),
    invalid("retry queue_name with a space", "POST", RETRY, "queue_name", NAME_PATTERN, json={"queue_name": "a b"}),
    invalid("retry extra field", "POST", RETRY, "queue", "unknown field", json={"queue": "x"}),
    invalid("retry body a JSON array", "POST", RETRY, "body", "must be a JSON object", json=[1]),
]


@pytest.mark.parametrize("bad", BAD_ACTIONS, ids=lambda b: b.case)
async def test_a_bad_retry_or_delete_gets_its_exact_problem(bad: Bad, start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.request(bad.method, bad.path, **bad.request)
    assert_problem(r, bad)


async def _in_dlq(redis_client: aioredis.Redis, keys: Keys, task_id: str) -> bool:
    return task_id in await redis_client.zrange(keys.dlq("default"), 0, -1)


async def test_a_405_names_every_method_of_its_path_in_allow(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        answers = {
            "PATCH a task": (await client.patch(f"{TASKS}/{UNKNOWN_ID}"), "DELETE, GET"),
            "PUT the task list": (await client.put(TASKS), "GET, POST"),
            "GET a pause": (await client.get("/api/v1/queues/default/pause"), "POST"),
        }
    for case, (r, allow) in answers.items():
        assert_problem(r, no_errors(case, "", "", 405, "Method Not Allowed"))
        assert r.headers["allow"] == allow, case


async def test_replay_by_ids_moves_exactly_those_dead_lettered_tasks_and_names_the_others(
    start_instance: Any, registry: Registry, redis_client: aioredis.Redis, keys: Keys
) -> None:
    register(registry)
    async with start_instance() as inst, http(inst) as client:
        first, second, third = [await create(client, {"name": "actions.flaky"}) for _ in range(3)]
        for task_id in (first, second, third):
            await wait_for(functools.partial(reached, client, task_id, "failed"))
        r = await client.post(
            "/api/v1/queues/default/dlq/replay", json={"ids": [second, UNKNOWN_ID, second], "override_priority": 9}
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"queue": "default", "count": 1, "replayed": [second], "not_replayed": [UNKNOWN_ID]}
        oldest = await client.post("/api/v1/queues/default/dlq/replay")  # no body: the oldest one
        assert oldest.json()["replayed"] == [first], oldest.text
        assert await redis_client.zrange(keys.dlq("default"), 0, -1) == [third]
        done = await wait_for(lambda: reached(client, second, "completed"))
        assert (done["task"]["priority"], done["latest_run"]["attempt"]) == (9, 2)
        assert (await snapshot(client, third))["task"]["status"] == "failed"


REPLAY = "/api/v1/queues/default/dlq/replay"
BAD_REPLAYS = [
    invalid(
        "replay with count and ids",
        "POST",
        REPLAY,
        "body",
        "give count (the oldest) or ids (those tasks), not both",
        json={"count": 1, "ids": [UNKNOWN_ID]},
    ),
    invalid(
        "replay of no ids",
        "POST",
        REPLAY,
        "ids",
        "List should have at least 1 item after validation, not 0",
        json={"ids": []},
    ),
    invalid(
        "replay of an id that is no uuid",
        "POST",
        REPLAY,
        "ids.0",
        "Input should be a valid UUID, invalid character: found `n` at 0",
        json={"ids": ["nope"]},
    ),
    invalid("replay ids a string", "POST", REPLAY, "ids", "Input should be a valid list", json={"ids": "x"}),
]


@pytest.mark.parametrize("bad", BAD_REPLAYS, ids=lambda b: b.case)
async def test_a_bad_replay_by_ids_gets_its_exact_problem(bad: Bad, start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.request(bad.method, bad.path, **bad.request)
    assert_problem(r, bad)
