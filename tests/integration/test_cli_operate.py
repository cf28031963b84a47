"""``taskmesh queues``, ``workers``, ``dlq`` and ``bulk``, as real processes against a real instance."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import asyncpg
import httpx
import pytest

from taskmesh.tasks.registry import Registry
from tests.cli_support import cli, register, table
from tests.conftest import http, wait_for
from tests.integration.test_cli_tasks import MISSING, create, status_is

pytestmark = pytest.mark.anyio

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


async def dead(client: httpx.AsyncClient, n: int, name: str = "cli.fail") -> list[str]:
    ids = [await create(client, {"name": name}) for _ in range(n)]
    for task_id in ids:
        await wait_for(partial(status_is, client, task_id, "failed"))
    return ids


async def test_queues_pause_list_show_resume_and_workers(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    register(registry)
    async with start_instance() as inst, http(inst) as client:
        paused = await cli(inst, "queues", "pause", "default", "--reason", "provider outage")
        assert (paused.code, paused.out) == (0, "default: paused (provider outage)\n"), paused.err
        assert await pool.fetchval("SELECT paused_at IS NOT NULL FROM queues WHERE name = 'default'") is True
        held = await create(client, {"name": "cli.ok"})

        listed = await cli(inst, "queues", "list")
        header, rows = table(listed.lines())
        assert header[:7] == ["QUEUE", "STATE", "READY", "DELAYED", "RUNNING", "RETRYING", "DEAD"]
        assert rows[0][:3] == ["default", "paused", "1"]
        as_json = await cli(inst, "queues", "list", "--json")
        assert as_json.json()["queues"][0]["reason"] == "provider outage"

        shown = await cli(inst, "queues", "show", "default")
        assert re.search(r"^state +paused since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", shown.out, re.M), shown.out
        assert re.search(rf"^{re.escape(inst.worker_id)} +running +\d+$", shown.out, re.M), shown.out

        workers = await cli(inst, "workers")
        header, rows = table(workers.lines())
        assert header[:5] == ["WORKER", "HOST", "PID", "STATE", "QUEUES"]
        assert [(r[0], r[3], r[4]) for r in rows] == [(inst.worker_id, "running", "default:1")]
        assert workers.err == "paused queues: default\n"

        resumed = await cli(inst, "queues", "resume", "default", "--json")
        assert (resumed.code, resumed.json()["paused"]) == (0, False)
        await wait_for(lambda: status_is(client, held, "completed"))

        bad = await cli(inst, "queues", "pause", "no spaces")
        assert bad.code == 2 and bad.err.startswith("taskmesh: error: Invalid request: queue: "), bad.err


async def test_dlq_list_replay_and_discard_name_the_ids_they_did_not_act_on(
    start_instance: Any, registry: Registry
) -> None:
    register(registry)
    async with start_instance() as inst, http(inst) as client:
        first, second, third = await dead(client, 3, "cli.flaky")
        done = await create(client, {"name": "cli.ok"})
        await wait_for(lambda: status_is(client, done, "completed"))

        listed = await cli(inst, "dlq", "list", "default")
        header, rows = table(listed.lines())
        assert header == ["ID", "NAME", "ATTEMPT", "FAILED (UTC)", "ERROR"]
        assert sorted((r[0], r[1], r[2], r[4]) for r in rows) == sorted(
            (t, "cli.flaky", "1", "NonRetryableError: first attempts fail") for t in (first, second, third)
        )
        # Oldest first, by when each was dead-lettered: the order the worker failed them in.
        second, third = [r[0] for r in rows if r[0] != first]

        replayed = await cli(inst, "dlq", "replay", "default", first, done)
        assert (replayed.code, replayed.out) == (1, f"replayed 1 from default\n  {first}\n")
        assert replayed.err == f"taskmesh: error: {done}: not dead-lettered in default\n"
        await wait_for(lambda: status_is(client, first, "completed"))

        oldest = await cli(inst, "dlq", "replay", "default", "--count", "1", "--priority", "700", "--json")
        assert (oldest.code, oldest.json()["replayed"]) == (0, [second])

        unexplained = await cli(inst, "dlq", "discard", "default", third)
        assert unexplained.code == 2 and "discarding cannot be undone: say why" in unexplained.err
        assert (await client.get(f"/api/v1/tasks/{third}")).status_code == 200
        discarded = await cli(inst, "dlq", "discard", "default", third, done, MISSING, "--reason", "dup of INC-9")
        assert (discarded.code, discarded.out) == (1, f"{third}: discarded\n")
        assert discarded.err.splitlines() == [
            f"taskmesh: error: {done}: not dead-lettered in default (it is completed in default)",
            f"taskmesh: error: {MISSING}: Task not found: no task has id {MISSING}",
        ]
        assert (await client.get(f"/api/v1/tasks/{third}")).status_code == 404

        both = await cli(inst, "dlq", "replay", "default", first, "--all")
        assert both.code == 2 and "give ids, --count or --all, not several" in both.err
        neither = await cli(inst, "dlq", "discard", "default")
        assert neither.code == 2 and "give the ids to discard, or --all" in neither.err


async def test_bulk_replay_by_filter_counts_first_asks_for_yes_then_follows_the_operation_to_its_end(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    calls = register(registry)
    async with start_instance() as inst, http(inst) as client:
        ids = await dead(client, 30, "cli.flaky")
        other = await dead(client, 1, "cli.fail")
        args = ("bulk", "replay", "--status", "failed", "--name", "cli.flaky")

        dry = await cli(inst, *args, "--dry-run")
        assert dry.code == 0 and dry.lines()[0] == "would replay 30 tasks, for example:", dry.out
        assert {line.strip() for line in dry.lines()[1:]} <= set(ids) and len(dry.lines()) == 11

        unexplained = await cli(inst, *args, "--yes")
        assert (unexplained.code, unexplained.err) == (
            2,
            "taskmesh: error: replay would act on 30 tasks; give --reason: why, kept with the operation and in the "
            "audit log\n",
        )
        unasked = await cli(inst, *args, "--reason", "INC-1")
        assert (unasked.code, unasked.out) == (2, "")
        assert unasked.err == "taskmesh: error: replay would act on 30 tasks; give --yes to do it without a terminal\n"
        assert await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'failed'") == 31

        ran = await cli(inst, *args, "--yes", "--reason", "INC-1")
        assert ran.code == 0, ran.err
        assert re.fullmatch(
            rf"operation {UUID} done: replayed 30, skipped 0 \(no longer in a state the action applies to\)\n", ran.out
        ), ran.out
        assert re.search(r"30/30 skipped 0", ran.err), ran.err  # the progress bar's last state
        for task_id in ids:
            await wait_for(partial(status_is, client, task_id, "completed"))
        assert all(calls[t] == 2 for t in ids)
        assert await status_is(client, other[0], "failed")

        again = await cli(inst, *args, "--yes")
        assert (again.code, again.out) == (0, "no task matches: nothing to replay\n")

        op_id = re.search(UUID, ran.out).group(0)  # type: ignore[union-attr]
        shown = await cli(inst, "bulk", "show", op_id, "--json")
        assert (shown.code, shown.json()["done"], shown.json()["reason"]) == (0, 30, "INC-1")

        everything = await cli(inst, "bulk", "delete", "--yes")
        assert (everything.code, everything.err) == (
            2,
            "taskmesh: error: Invalid request: filter: give at least one filter (an action on every task is refused)\n",
        )
        unknown = await cli(inst, "bulk", "show", MISSING)
        assert unknown.code == 3, unknown.err
        not_uuid = await cli(inst, "bulk", "show", "../x")
        assert (not_uuid.code, not_uuid.err) == (
            2,
            "taskmesh: error: Invalid request: operation_id: must be a UUID (got '../x')\n",
        )


async def test_ids_and_names_cannot_reach_another_route_and_control_characters_print_escaped(
    start_instance: Any, registry: Registry
) -> None:
    register(registry)
    async with start_instance() as inst, http(inst) as client:
        queued = await create(client, {"name": "cli.ok", "delay_seconds": 3600, "dedup_key": "acme\x1b[2J\x1b]0;owned"})
        orphan = await create(client, {"name": "cli.ok", "queue_name": "orphans"})

        injected = await cli(inst, "queues", "pause", f"../tasks/{queued}/cancel?")
        assert (injected.code, injected.err) == (
            2,
            f"taskmesh: error: Invalid request: queue: must match [A-Za-z0-9_.:-]{{1,128}} "
            f"(got '../tasks/{queued}/cancel?')\n",
        )
        sneaky = await cli(inst, "tasks", "retry", "../queues/zz/pause?")
        assert sneaky.code == 2
        assert sneaky.err == (
            "taskmesh: error: ../queues/zz/pause?: Invalid request: task_id: must be a UUID "
            "(got '../queues/zz/pause?')\n"
        )
        newline = await cli(inst, "tasks", "show", "a\nb")
        assert (newline.code, newline.err) == (
            2,
            "taskmesh: error: Invalid request: task_id: must be a UUID (got 'a\\nb')\n",
        )
        assert await status_is(client, queued, "queued")
        assert (await client.get("/api/v1/queues/zz")).json()["paused"] is False

        shown = await cli(inst, "tasks", "show", queued)
        assert "\x1b" not in shown.out
        assert re.search(r"^dedup key +acme\\x1b\[2J\\x1b\]0;owned$", shown.out, re.M), shown.out

        workers = await cli(inst, "workers")
        assert workers.err == "queues with work and no instance serving them: orphans (1 queued)\n"
        assert orphan
