"""``taskmesh workflows list|show|cancel|retry``, as real processes against a real instance.

Each verb is checked for its table or line, its ``--json`` (the API's own answer), and
the exit status of each way it can be refused.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from taskmesh.tasks.registry import Registry
from tests.cli_support import MARKUP_ERROR, cli, register, table
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

WORKFLOWS = "/api/v1/workflows"
MISSING = "00000000-0000-4000-8000-000000000000"


def register_workflow_tasks(registry: Registry) -> None:
    """``cli.*`` of :func:`register`, with ``wf.items`` (two payloads for a map) and ``wf.hold`` (a minute)."""
    register(registry)

    @registry.task("wf.items")
    async def items(payload: Any) -> list[dict[str, int]]:
        return [{"n": 1}, {"n": 2}]

    @registry.task("wf.hold")
    async def hold(payload: Any) -> None:
        await anyio.sleep(60)


async def submit(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(WORKFLOWS, json=body)
    assert r.status_code == 201, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def workflow(client: httpx.AsyncClient, workflow_id: str) -> dict[str, Any]:
    r = await client.get(f"{WORKFLOWS}/{workflow_id}")
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def fields(lines: list[str]) -> dict[str, str]:
    """The ``name  value`` lines above the nodes table, by name."""
    above = lines[: lines.index("")]
    return {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in above}


async def ended(client: httpx.AsyncClient, workflow_id: str, status: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        wf = await workflow(client, workflow_id)
        return wf if wf["status"] == status else None

    answer: dict[str, Any] = await wait_for(check, timeout=20)
    return answer


FANOUT = {
    "name": "cli-fanout",
    "context": {"day": "2026-12-01"},
    "nodes": [
        {"id": "src", "task": "wf.items"},
        {"id": "each", "task": "cli.ok", "map": {"from": "src"}, "deps": ["src"]},
        {"id": "end", "task": "cli.ok", "payload": {"n": 3}, "deps": ["each"]},
    ],
}
BROKEN = {
    "name": "cli-broken",
    "nodes": [
        {"id": "bad", "task": "cli.fail"},
        {"id": "after", "task": "cli.ok", "deps": ["bad"]},
    ],
}


async def test_workflows_list_prints_a_table_its_json_is_the_api_answer_and_filters_and_pages_pass_through(
    start_instance: Any, registry: Registry
) -> None:
    register_workflow_tasks(registry)
    async with start_instance() as inst, http(inst) as client:
        fanout = (await submit(client, FANOUT))["workflow_id"]
        await ended(client, fanout, "completed")
        broken = (await submit(client, BROKEN))["workflow_id"]
        await ended(client, broken, "failed")

        listed = await cli(inst, "workflows", "list")
        assert listed.code == 0, listed.err
        header, rows = table(listed.lines())
        assert header == ["ID", "NAME", "STATUS", "TENANT", "CREATED (UTC)", "FINISHED (UTC)", "TASKS"]
        assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
            (broken, "cli-broken", "failed", "-"),
            (fanout, "cli-fanout", "completed", "-"),
        ]
        assert (rows[0][6], rows[1][6]) == ("failed 1, skipped 1", "completed 4")

        as_json = await cli(inst, "workflows", "list", "--json")
        api = (await client.get(WORKFLOWS)).json()
        assert (as_json.code, as_json.json()) == (0, api)

        failed = await cli(inst, "workflows", "list", "--status", "failed")
        assert [r[0] for r in table(failed.lines())[1]] == [broken]
        named = await cli(inst, "workflows", "list", "--name", "cli-fanout", "--created-after", "2000-01-01T00:00:00Z")
        assert [r[0] for r in table(named.lines())[1]] == [fanout]

        first = await cli(inst, "workflows", "list", "--limit", "1")
        assert [r[0] for r in table(first.lines())[1]] == [broken]
        cursor = first.err.strip().removeprefix("next page: --cursor ")
        assert first.err.strip() == f"next page: --cursor {cursor}"
        rest = await cli(inst, "workflows", "list", "-l", "1", "--cursor", cursor)
        assert ([r[0] for r in table(rest.lines())[1]], rest.err) == ([fanout], "")

        none = await cli(inst, "workflows", "list", "--name", "no-such-workflow")
        assert (none.code, none.lines()[2:], none.err) == (0, [], "no workflow matches\n")
        bad = await cli(inst, "workflows", "list", "--status", "bogus")
        assert bad.code == 2 and bad.err.startswith("taskmesh: error: Invalid request: "), bad.err


async def test_workflows_show_prints_the_fields_counts_and_a_row_per_node(
    start_instance: Any, registry: Registry
) -> None:
    register_workflow_tasks(registry)
    async with start_instance() as inst, http(inst) as client:
        submitted = await submit(client, FANOUT)
        fanout = submitted["workflow_id"]
        await ended(client, fanout, "completed")
        shown = await cli(inst, "workflows", "show", fanout)
        assert shown.code == 0, shown.err
        lines = shown.lines()
        shown_fields = fields(lines)
        assert tuple(shown_fields[k] for k in ("id", "name", "status", "context", "tasks")) == (
            fanout,
            "cli-fanout",
            "completed",
            '{"day":"2026-12-01"}',
            "completed 4",
        )
        nodes_at = lines.index("nodes")
        header, rows = table(lines[nodes_at + 1 :])
        assert header == ["NODE", "KIND", "STATE", "DEPS", "WAITING FOR", "TASK", "ERROR"]
        assert rows == [
            ["src", "task", "succeeded", "-", "-", submitted["nodes"]["src"], "-"],
            ["each", "map", "succeeded", "src", "-", "2 tasks: completed 2", "-"],
            ["end", "task", "succeeded", "each", "-", submitted["nodes"]["end"], "-"],
        ]
        as_json = await cli(inst, "workflows", "show", fanout, "--json")
        assert (as_json.code, as_json.json()) == (0, await workflow(client, fanout))

        broken = await submit(client, BROKEN)
        await ended(client, broken["workflow_id"], "failed")
        shown = await cli(inst, "workflows", "show", broken["workflow_id"])
        lines = shown.lines()
        rows = table(lines[lines.index("nodes") + 1 :])[1]
        assert rows[0][:3] == ["bad", "task", "failed"] and rows[0][5] == broken["nodes"]["bad"]
        # Printed as it is: rich must not take the error's brackets for markup.
        assert rows[0][6] == f"NonRetryableError: {MARKUP_ERROR}"
        assert rows[1][:3] == ["after", "task", "skipped"]

        missing = await cli(inst, "workflows", "show", MISSING)
        assert (missing.code, missing.out) == (3, "") and missing.err.startswith("taskmesh: error: "), missing.err
        assert MISSING in missing.err
        not_uuid = await cli(inst, "workflows", "show", "nope")
        assert (not_uuid.code, not_uuid.err) == (
            2,
            "taskmesh: error: Invalid request: workflow_id: must be a UUID (got 'nope')\n",
        )


async def test_workflows_cancel_and_retry_say_what_they_did_and_exit_4_when_the_state_refuses(
    start_instance: Any, registry: Registry
) -> None:
    register_workflow_tasks(registry)
    async with start_instance() as inst, http(inst) as client:
        held = (
            await submit(
                client,
                {
                    "name": "cli-held",
                    "nodes": [{"id": "hold", "task": "wf.hold"}, {"id": "next", "task": "cli.ok", "deps": ["hold"]}],
                },
            )
        )["workflow_id"]

        async def holding() -> bool:
            return bool((await workflow(client, held))["counts"].get("running"))

        await wait_for(holding)
        cancelled = await cli(inst, "workflows", "cancel", held, "--reason", "wrong input file")
        assert (cancelled.code, cancelled.err) == (0, "")
        assert cancelled.out == f"{held}: cancelled; 1 tasks cancelled, 1 running tasks asked to stop\n"

        async def stopped() -> bool:  # its running task was asked to stop: once it has, nothing is left
            return (await workflow(client, held))["finished_at"] is not None

        await wait_for(stopped)
        again = await cli(inst, "workflows", "cancel", held, "--json")
        assert (again.code, again.json()) == (
            0,
            {"workflow_id": held, "status": "cancelled", "cancelled": 0, "cancel_requested": 0},
        )
        shown = await cli(inst, "workflows", "show", held)
        assert fields(shown.lines())["cancel reason"] == "wrong input file"

        two_after = {**BROKEN, "nodes": [*BROKEN["nodes"], {"id": "also", "task": "cli.ok", "deps": ["bad"]}]}
        broken = (await submit(client, two_after))["workflow_id"]
        await ended(client, broken, "failed")
        retried = await cli(inst, "workflows", "retry", broken)
        assert (retried.code, retried.err) == (0, "")
        assert retried.out == f"{broken}: running; 1 tasks queued again, 2 waiting for them again\n"
        await ended(client, broken, "failed")  # cli.fail fails every time
        as_json = await cli(inst, "workflows", "retry", broken, "--json")
        assert as_json.json() == {"workflow_id": broken, "status": "running", "requeued": 1, "reblocked": 2}

        done = (await submit(client, FANOUT))["workflow_id"]
        await ended(client, done, "completed")
        for verb in ("cancel", "retry"):
            refused = await cli(inst, "workflows", verb, done)
            assert (refused.code, refused.out) == (4, ""), (verb, refused)
            assert refused.err.startswith("taskmesh: error: ") and "Traceback" not in refused.err
        missing = await cli(inst, "workflows", "retry", MISSING)
        assert missing.code == 3, missing
