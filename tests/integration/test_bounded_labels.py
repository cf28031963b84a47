"""Labels from clients are bounded, and a queue no instance serves is visible.

1,000 creates with random task names once grew ``/metrics`` from 144 series to
48,178 (5.6 MB). Now a task name is a label only when a handler is registered
under it (else ``(other)``), and a queue only when the instance is configured
with it or a live worker serves it (else ``(unserved)``). A task sent to a queue
no live instance serves is still stored, but the create answer warns, the
sampler counts it under ``taskmesh_queue_depth{queue="(unserved)",
state="ready"}`` and ``GET /api/v1/workers`` lists the queue in
``unserved_queues``.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from taskmesh.api.state import ServedQueues
from taskmesh.store import Stores
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for
from tests.integration.test_metrics_exposed import sample as value

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"
SERIES = re.compile(r"^taskmesh_\w+(\{[^}]*\})? ", re.M)
SERIES_GROWTH_MAX = 100
"""New series 1,000 random names and queues may add: the (other)/(unserved) children of each family."""


def series(text: str) -> set[str]:
    """The ``taskmesh_`` series of an exposition (name and labels, without the value)."""
    return {m.group(0) for m in SERIES.finditer(text)}


def named_series(text: str) -> set[str]:
    """The series with a ``queue`` or ``task_name`` label: those client-chosen names could grow.

    Others (a service's first tick of some outcome) may appear at any time and are not under test.
    """
    return {s for s in series(text) if 'queue="' in s or 'task_name="' in s}


async def create_many(client: httpx.AsyncClient, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """POST each body to ``/api/v1/tasks``, 20 at a time; every answer must be 201."""
    answers: list[httpx.Response] = []
    limiter = anyio.CapacityLimiter(20)

    async def one(body: dict[str, Any]) -> None:
        async with limiter:
            answers.append(await client.post(TASKS, json=body))

    async with anyio.create_task_group() as tg:
        for body in bodies:
            tg.start_soon(one, body)
    assert [r.status_code for r in answers if r.status_code != 201] == []
    return answers


def random_bodies(n: int) -> list[dict[str, Any]]:
    """``n`` creates with random task names: half to the served queue ``default``, half to random queues."""
    return [
        {"name": f"rnd.{secrets.token_hex(6)}", "queue_name": "default" if i % 2 else f"q-{secrets.token_hex(6)}"}
        for i in range(n)
    ]


async def test_a_thousand_creates_with_random_names_and_queues_add_a_bounded_number_of_series(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    @registry.task("labels.known")
    async def known(payload: Any) -> str:
        return "ok"

    async with start_instance(metrics_sample_seconds=0.1, worker_concurrency=8) as inst, http(inst) as client:
        await create_many(client, [{"name": "labels.known"}])

        async def known_ran() -> str | None:
            text = (await client.get("/metrics")).text
            labels = {"queue": "default", "task_name": "labels.known", "outcome": "succeeded"}
            return text if value(text, "taskmesh_runs_finished_total", **labels) == 1 else None

        before = series(await wait_for(known_ran))

        async def settled(failed: int) -> str | None:
            """/metrics once the served queue's random tasks all failed (no handler) and a sample saw them."""
            if await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'failed'") != failed:
                return None
            text = (await client.get("/metrics")).text
            return text if value(text, "taskmesh_queue_depth", queue="default", state="dead_letter") == failed else None

        await create_many(client, random_bodies(1000))
        after_first = await wait_for(lambda: settled(500), timeout=30)
        await create_many(client, random_bodies(200))
        after_second = await wait_for(lambda: settled(600), timeout=30)

    grown = series(after_first) - before
    assert len(grown) <= SERIES_GROWTH_MAX, f"{len(grown)} new series, {len(after_first)} bytes"
    assert named_series(after_second) - named_series(after_first) == set(), "new random names added series"
    assert value(after_second, "taskmesh_queue_depth", queue="(unserved)", state="ready") == 600
    labels = {"queue": "default", "task_name": "(other)", "outcome": "failed"}
    assert value(after_second, "taskmesh_runs_finished_total", **labels) == 600
    assert "rnd." not in after_second and 'queue="q-' not in after_second
    assert value(after_second, "taskmesh_tasks_created_total", queue="default") == 601
    assert value(after_second, "taskmesh_tasks_created_total", queue="(unserved)") == 600
    assert value(after_second, "taskmesh_runs_started_total", queue="default", task_name="(other)") == 600
    assert value(after_second, "taskmesh_runs_started_total", queue="default", task_name="labels.known") == 1
    assert value(after_second, "taskmesh_queue_wait_seconds_count", queue="default", task_name="(other)") == 600
    assert len(after_second) < 100_000, f"/metrics is {len(after_second)} bytes"


async def test_a_task_sent_to_a_queue_no_instance_serves_is_visible_in_the_answer_the_depth_and_the_workers_listing(
    start_instance: Any, registry: Registry
) -> None:
    @registry.task("visible.job")
    async def job(payload: Any) -> str:
        return "ok"

    warning = "queue 'defualt' is served by no live instance"
    async with start_instance(metrics_sample_seconds=0.1, queue_names=["default", "emails"]) as inst:
        async with http(inst) as client:
            typos = [await client.post(TASKS, json={"name": "visible.job", "queue_name": "defualt"}) for _ in range(3)]
            served = await client.post(TASKS, json={"name": "visible.job", "queue_name": "emails"})
            batch = await client.post(
                f"{TASKS}:batch",
                json={
                    "tasks": [
                        {"name": "visible.job", "queue_name": "default"},
                        {"name": "visible.job", "queue_name": "defualt"},
                        {"name": "visible.job", "queue_name": "other"},
                        {"name": "visible.job", "queue_name": "defualt", "dedup_key": "k"},
                        {"name": "visible.job", "queue_name": "defualt", "dedup_key": "k"},
                    ]
                },
            )

            for r in typos:
                assert r.status_code == 201
                assert r.json()["warnings"] == [warning]

            async def sampled() -> str | None:
                text = (await client.get("/metrics")).text
                depth = value(text, "taskmesh_queue_depth", queue="(unserved)", state="ready")
                return text if depth == 6 else None

            text = await wait_for(sampled)
            listing = (await client.get("/api/v1/workers")).json()

            # A second instance starts serving the typo: it is no longer unserved anywhere.
            async with start_instance(queue_names=["defualt"]):
                fixed = await client.post(TASKS, json={"name": "visible.job", "queue_name": "defualt"})

                async def drained() -> Any:
                    body = (await client.get("/api/v1/workers")).json()
                    return body if body["unserved_queues"] == [{"queue": "other", "queued": 1}] else None

                await wait_for(drained, timeout=15)

                async def one_left() -> bool:
                    text = (await client.get("/metrics")).text
                    return value(text, "taskmesh_queue_depth", queue="(unserved)", state="ready") == 1

                await wait_for(one_left)
                # Served by a live worker now: the queue is a label of its own on this instance too.
                # (The create just before may have met the served-queues cache before or after its
                # refresh, so the count is taken from here on.)
                before = value((await client.get("/metrics")).text, "taskmesh_tasks_created_total", queue="defualt")
                await client.post(TASKS, json={"name": "visible.job", "queue_name": "defualt"})
                after = (await client.get("/metrics")).text

    assert served.status_code == 201 and "warnings" not in served.json()
    results = batch.json()["results"]
    assert ["warnings" in item for item in results] == [False, True, True, True, False]
    assert results[1]["warnings"] == [warning]
    assert results[2]["warnings"] == ["queue 'other' is served by no live instance"]
    assert results[4]["status"] == "deduplicated"
    assert value(text, "taskmesh_tasks_created_total", queue="(unserved)") == 6
    assert 'queue="defualt"' not in text
    assert listing["unserved_queues"] == [{"queue": "defualt", "queued": 5}, {"queue": "other", "queued": 1}]
    assert [w["queues"] for w in listing["workers"]] == [{"default": 1, "emails": 1}]
    assert fixed.status_code == 201
    assert value(after, "taskmesh_tasks_created_total", queue="defualt") == (before or 0) + 1


async def test_the_served_queues_are_read_once_per_ttl_and_the_instances_own_always_count(
    stores: Stores, pool: asyncpg.Pool
) -> None:
    served = ServedQueues(own=frozenset({"mine"}), own_names=frozenset({"a.job"}), ttl=0.3)
    assert await served.get(stores.pg) == {"mine": frozenset({"a.job"})}
    await pool.execute(
        """INSERT INTO workers (id, host, pid, queues, version, state, handlers)
           VALUES ('w-1', 'h', 1, '{"emails": 2, "reports": 1}', 'v', 'running', '{mail.send,report.export}'),
                  ('w-2', 'h', 2, '{"reports": 1, "mine": 1}', 'v', 'running', '{report.pdf}'),
                  ('w-3', 'h', 3, '{"any": 1}', 'v', 'draining', NULL),
                  ('w-4', 'h', 4, '{"gone": 1}', 'v', 'stopped', '{x}')"""
    )
    assert await served.get(stores.pg) == {"mine": frozenset({"a.job"})}, "read again within the ttl"
    await anyio.sleep(0.35)
    assert await served.get(stores.pg) == {
        "mine": frozenset({"a.job", "report.pdf"}),
        "emails": frozenset({"mail.send", "report.export"}),
        "reports": frozenset({"mail.send", "report.export", "report.pdf"}),
        "any": None,
    }


async def test_a_task_name_no_live_instance_has_a_handler_for_is_created_with_a_warning(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    @registry.task("report.export")
    async def export(payload: Any) -> str:
        return "ok"

    async with start_instance(queue_names=["default"]) as inst, http(inst) as client:
        typo = await client.post(TASKS, json={"name": "reprot.export"})
        known = await client.post(TASKS, json={"name": "report.export"})
        batch = await client.post(f"{TASKS}:batch", json={"tasks": [{"name": "report.export"}, {"name": "report.pdf"}]})
        # Another live instance serving the queue with a handler for it: no warning from then on
        # (this instance reads the workers table again after its cache's ttl).
        await pool.execute(
            """INSERT INTO workers (id, host, pid, queues, version, state, handlers)
               VALUES ('pdf-worker', 'h', 1, '{"default": 1}', 'v', 'running', '{report.pdf}')"""
        )
        assert inst.state is not None
        inst.state.served.ttl = 0
        pdf = await client.post(TASKS, json={"name": "report.pdf", "delay_seconds": 3600})
    assert (typo.status_code, typo.json()["warnings"]) == (
        201,
        ["no live instance serving queue 'default' has a handler for 'reprot.export'"],
    )
    assert known.status_code == 201 and "warnings" not in known.json()
    assert [r.get("warnings") for r in batch.json()["results"]] == [
        None,
        ["no live instance serving queue 'default' has a handler for 'report.pdf'"],
    ]
    assert pdf.status_code == 201 and "warnings" not in pdf.json()


async def test_an_instance_with_a_fallback_handler_runs_any_name_so_no_name_is_warned_about(
    start_instance: Any, registry: Registry
) -> None:
    from taskmesh.dev.demo import demo_handler

    registry.fallback = demo_handler()
    async with start_instance(queue_names=["default"]) as inst, http(inst) as client:
        r = await client.post(TASKS, json={"name": "anything.at.all", "delay_seconds": 3600})
    assert r.status_code == 201 and "warnings" not in r.json()
