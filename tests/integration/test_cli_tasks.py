"""``taskmesh tasks list|show|retry|cancel|delete``, as real processes against a real instance.

Each verb is checked for its table, its ``--json`` (the API's own answer), and the
exact message and exit status of each way it can be refused.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import httpx
import pytest

from taskmesh.tasks.registry import Registry
from tests.cli_support import MARKUP_ERROR, cli, register, table
from tests.conftest import http, wait_for
from tests.integration.test_task_actions import NOT_DELETABLE, NOT_RETRYABLE

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"
MISSING = "00000000-0000-4000-8000-000000000000"


async def create(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    r = await client.post(TASKS, json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["task_id"])


async def status_is(client: httpx.AsyncClient, task_id: str, status: str) -> bool:
    return bool((await client.get(f"{TASKS}/{task_id}")).json()["task"]["status"] == status)


async def test_tasks_list_prints_a_table_its_json_is_the_api_answer_and_filters_and_pages_pass_through(
    start_instance: Any, registry: Registry
) -> None:
    register(registry)
    async with start_instance() as inst, http(inst) as client:
        ok = await create(client, {"name": "cli.ok", "payload": {"customer": {"id": 7}}})
        failed = [await create(client, {"name": "cli.fail", "payload": {"customer": {"id": 7}}}) for _ in range(2)]
        for task_id in [ok, *failed]:
            await wait_for(partial(status_is, client, task_id, "completed" if task_id == ok else "failed"))

        listed = await cli(inst, "tasks", "list", "--status", "failed")
        assert listed.code == 0, listed.err
        header, rows = table(listed.lines())
        assert header == ["ID", "NAME", "QUEUE", "STATUS", "ATTEMPTS", "CREATED (UTC)", "ERROR"]
        assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
            (t, "cli.fail", "default", "failed", "1") for t in reversed(failed)
        ]
        # Printed as it is: rich must not take the error's brackets for markup.
        assert {r[6] for r in rows} == {f"NonRetryableError: {MARKUP_ERROR}"}

        as_json = await cli(inst, "tasks", "list", "--status", "failed", "--json")
        api = (await client.get(TASKS, params={"status": "failed"})).json()
        assert (as_json.code, as_json.json()) == (0, api)

        first = await cli(inst, "tasks", "list", "--payload", "customer.id=7", "--limit", "2", "--oldest-first")
        assert [r[0] for r in table(first.lines())[1]] == [ok, failed[0]]
        cursor = first.err.strip().removeprefix("next page: --cursor ")
        assert first.err.strip() == f"next page: --cursor {cursor}"
        rest = await cli(inst, "tasks", "list", "-p", "customer.id=7", "-l", "2", "--oldest-first", "--cursor", cursor)
        assert ([r[0] for r in table(rest.lines())[1]], rest.err) == ([failed[1]], "")

        none = await cli(inst, "tasks", "list", "--payload", "customer.id=8")
        assert (none.code, none.lines()[2:], none.err) == (0, [], "no task matches\n")


async def test_bad_filters_are_refused_with_the_api_message_and_exit_2(start_instance: Any) -> None:
    async with start_instance() as inst:
        bad = {
            ("--status", "bogus"): "status: must be one of blocked, queued, running, completed, failed, cancelled, "
            "skipped",
            ("--created-after", "yesterday"): "created_after: must be an RFC 3339 time with an offset, "
            "e.g. 2026-01-01T12:00:00Z",
            ("--payload", "customer.id"): None,
        }
        for args, detail in bad.items():
            ran = await cli(inst, "tasks", "list", *args)
            assert ran.code == 2, (args, ran)
            if detail is not None:
                assert ran.err == f"taskmesh: error: Invalid request: {detail}\n"
            else:
                assert "'customer.id' is not PATH=VALUE (customer.id=42)" in ran.err
            assert "Traceback" not in ran.err


async def test_tasks_show_prints_fields_runs_and_the_traceback_and_waits_for_the_end(
    start_instance: Any, registry: Registry
) -> None:
    register(registry)
    async with start_instance() as inst, http(inst) as client:
        failed = await create(client, {"name": "cli.fail", "payload": {"n": 1}})
        await wait_for(lambda: status_is(client, failed, "failed"))
        shown = await cli(inst, "tasks", "show", failed)
        assert shown.code == 0, shown.err
        fields = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in shown.lines()[:14]}
        assert (fields["id"], fields["status"], fields["attempts"], fields["payload"]) == (
            failed,
            "failed",
            "1",
            '{"n":1}',
        )
        runs_at = shown.lines().index("runs")
        header, rows = table(shown.lines()[runs_at + 1 : runs_at + 4])
        assert header == ["ATTEMPT", "STATUS", "WORKER", "STARTED (UTC)", "TOOK", "ERROR"]
        assert (rows[0][0], rows[0][1], rows[0][2], rows[0][5]) == (
            "1",
            "failed",
            inst.worker_id,
            f"NonRetryableError: {MARKUP_ERROR}",
        )
        assert "traceback of attempt 1:" in shown.lines()

        slow = await create(client, {"name": "cli.slow"})
        waited = await cli(inst, "tasks", "show", slow, "--wait", "20", "--json")
        answer = waited.json()
        assert (waited.code, answer["task"]["status"], answer["latest_run"]["result"]) == (0, "completed", "slow done")
        assert [(r["attempt"], r["status"]) for r in answer["runs"]] == [(1, "succeeded")]

        missing = await cli(inst, "tasks", "show", MISSING)
        assert (missing.code, missing.out, missing.err) == (
            3,
            "",
            f"taskmesh: error: Task not found: no task has id {MISSING}\n",
        )
        not_uuid = await cli(inst, "tasks", "show", "nope")
        assert (not_uuid.code, not_uuid.err) == (
            2,
            "taskmesh: error: Invalid request: task_id: must be a UUID (got 'nope')\n",
        )


async def test_retry_cancel_and_delete_act_on_each_id_and_exit_with_the_first_refusal(
    start_instance: Any, registry: Registry
) -> None:
    register(registry)
    async with start_instance(queue_names=["default", "urgent"]) as inst, http(inst) as client:
        flaky = await create(client, {"name": "cli.flaky"})
        done = await create(client, {"name": "cli.ok"})
        later = await create(client, {"name": "cli.ok", "delay_seconds": 3600})
        await wait_for(lambda: status_is(client, flaky, "failed"))
        await wait_for(lambda: status_is(client, done, "completed"))

        retried = await cli(inst, "tasks", "retry", flaky, "--priority", "900", "--queue", "urgent")
        assert (retried.code, retried.out, retried.err) == (0, f"{flaky}: failed -> queued on urgent\n", "")
        await wait_for(lambda: status_is(client, flaky, "completed"))
        task = (await client.get(f"{TASKS}/{flaky}")).json()["task"]
        assert (task["queue_name"], task["priority"], task["attempts"]) == ("urgent", 900, 2)

        refused = await cli(inst, "tasks", "retry", later, done)
        assert refused.code == 4
        assert refused.err.splitlines() == [
            f"taskmesh: error: {later}: Task state conflict: task {later} is queued; {NOT_RETRYABLE}",
            f"taskmesh: error: {done}: Task state conflict: task {done} is completed; {NOT_RETRYABLE}",
        ]

        cancelled = await cli(inst, "tasks", "cancel", later, "--json")
        assert (cancelled.code, cancelled.json()) == (0, {"task_id": later, "status": "cancelled"})

        not_deletable = await create(client, {"name": "cli.ok", "delay_seconds": 3600})
        unexplained = await cli(inst, "tasks", "delete", later, "--reason", " ")
        assert unexplained.code == 2 and "deleting cannot be undone: say why" in unexplained.err
        assert (await client.get(f"{TASKS}/{later}")).status_code == 200
        deleted = await cli(inst, "tasks", "delete", MISSING, later, not_deletable, "-r", "test data", "--json")
        assert deleted.code == 3  # the first refusal's status
        assert deleted.json_lines() == [
            {"task_id": MISSING, "error": f"Task not found: no task has id {MISSING}", "status": 404},
            {"task_id": later, "deleted": True},
            {
                "task_id": not_deletable,
                "error": f"Task state conflict: task {not_deletable} is queued; {NOT_DELETABLE}",
                "status": 409,
            },
        ]
        assert (await client.get(f"{TASKS}/{later}")).status_code == 404
