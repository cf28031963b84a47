"""A statement the database's schema refuses reads as a schema mismatch, not as a store that did not answer.

What an instance meets when its release and the schema disagree (an older instance after a newer
``taskmesh migrate``, or a newer one before it) is played here by renaming a column the instance's
statements use, on a database of the test's own: the API answers 500 "Schema mismatch" naming the way
out, every service that meets it (the API, the fetcher's claim, the scheduler's fire) logs
``schema_mismatch`` and counts ``taskmesh_store_schema_errors_total`` by statement, and ``/readyz`` is
503 naming it until none was seen for ``schema_error_window_seconds``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any

import anyio
import asyncpg
import pytest
import structlog

import taskmesh
from taskmesh.config import Settings
from taskmesh.runtime import supervisor
from taskmesh.store.postgres import migrate_url
from taskmesh.tasks.registry import Registry
from tests.conftest import http, running, scratch_database, wait_for
from tests.pgbouncer import through

pytestmark = pytest.mark.anyio

WINDOW_SECONDS = 1.0
"""``schema_error_window_seconds`` of the tests' instances: short, so that ``/readyz`` turns green soon."""
DETAIL = (
    f"the database schema and this instance's version ({taskmesh.__version__}) disagree: run `taskmesh migrate`, "
    "or replace this instance with the release that applied the schema"
)


@pytest.fixture
async def schema_db(store_urls: tuple[str, str], pgbouncer_address: str | None) -> AsyncIterator[tuple[str, str]]:
    """A migrated database of the test's own, changed under the instance: ``(direct URL, the instance's URL)``."""
    async with scratch_database(store_urls[0], "tm_schema") as direct:
        await migrate_url(direct)
        yield direct, direct if pgbouncer_address is None else through(direct, pgbouncer_address)


@contextlib.asynccontextmanager
async def renamed(url: str, table: str, column: str) -> AsyncIterator[Callable[[], Any]]:
    """``column`` of ``table`` renamed (what a migration of another release would do); yields the undo."""
    conn = await asyncpg.connect(url)
    back = f"ALTER TABLE {table} RENAME COLUMN {column}_renamed TO {column}"
    undone = False

    async def undo() -> None:
        nonlocal undone
        if not undone:
            await conn.execute(back)
            undone = True

    try:
        await conn.execute(f"ALTER TABLE {table} RENAME COLUMN {column} TO {column}_renamed")
        yield undo
    finally:
        with anyio.CancelScope(shield=True):
            await undo()
            await conn.close()


def counted(inst: supervisor.Instance, operation: str) -> float:
    """``taskmesh_store_schema_errors_total`` of ``operation`` on the instance."""
    assert inst.state is not None
    value = inst.state.metrics.registry.get_sample_value("taskmesh_store_schema_errors_total", {"operation": operation})
    return value or 0.0


async def seen(inst: supervisor.Instance, operation: str) -> bool:
    return counted(inst, operation) >= 1


def events(logs: list[MutableMapping[str, Any]], name: str, **fields: Any) -> list[MutableMapping[str, Any]]:
    return [line for line in logs if line["event"] == name and all(line.get(k) == v for k, v in fields.items())]


async def test_a_renamed_column_answers_schema_mismatch_is_logged_counted_and_turns_readyz_red(
    schema_db: tuple[str, str], make_settings: Callable[..., Settings], registry: Registry, redis_client: Any
) -> None:
    direct, url = schema_db
    settings = make_settings(
        database_url=url, schema_error_window_seconds=WINDOW_SECONDS, reconcile_interval_seconds=3600
    )
    with structlog.testing.capture_logs() as logs:
        async with running(settings, registry) as inst, http(inst) as client:
            assert (await client.get("/readyz")).status_code == 200
            async with renamed(direct, "tasks", "priority") as undo:
                answers = [await client.post("/api/v1/tasks", json={"name": "schema.any"}) for _ in range(3)]
                for r in answers:
                    assert r.status_code == 500, r.text
                    assert r.headers["content-type"] == "application/problem+json"
                    assert r.json() == {
                        "type": "about:blank",
                        "title": "Schema mismatch",
                        "status": 500,
                        "detail": DETAIL,
                        "operation": "task_insert_many",
                        "sqlstate": "42703",
                    }
                    assert "priority" not in r.text  # neither the statement nor PostgreSQL's message
                assert counted(inst, "task_insert_many") == 3
                scraped = (await client.get("/metrics")).text
                assert 'taskmesh_store_schema_errors_total{operation="task_insert_many"} 3.0' in scraped
                ready = await client.get("/readyz")
                assert ready.status_code == 503
                body = ready.json()
                assert (body["ready"], body["postgres"], body["redis"]) == (False, "ok", "ok")
                assert {k: v for k, v in body["schema_mismatch"].items() if k != "seconds_ago"} == {
                    "operation": "task_insert_many",
                    "sqlstate": "42703",
                }
                assert 0 <= body["schema_mismatch"]["seconds_ago"] < WINDOW_SECONDS
                # A flood logs its first line at once, the rest as one line with their count later.
                [first] = events(logs, "schema_mismatch", operation="task_insert_many")
                assert (first["log_level"], first["sqlstate"], first["count"]) == ("error", "42703", 1)
                assert first["error"] == 'UndefinedColumnError: column "priority" of relation "tasks" does not exist'
                assert not events(logs, "api_error")
                await undo()
            await wait_for(lambda: ready_now(client), timeout=5 * WINDOW_SECONDS)
            assert inst.state is not None
            last = inst.state.schema.last
            assert last is not None and time.monotonic() - last.at >= WINDOW_SECONDS
            assert (await client.post("/api/v1/tasks", json={"name": "schema.any"})).status_code == 201
    lines = events(logs, "schema_mismatch", operation="task_insert_many")
    assert [line["count"] for line in lines] == [1, 2]  # the rest, logged when the store closed


async def ready_now(client: Any) -> bool:
    r = await client.get("/readyz")
    return bool(r.status_code == 200 and "schema_mismatch" not in r.json())


async def test_the_fetchers_claim_and_the_schedulers_fire_are_logged_and_counted(
    schema_db: tuple[str, str], make_settings: Callable[..., Settings], registry: Registry, redis_client: Any
) -> None:
    @registry.task("schema.noop")
    async def noop(payload: Any) -> None:
        return None

    direct, url = schema_db
    settings = make_settings(
        database_url=url,
        schema_error_window_seconds=WINDOW_SECONDS,
        reconcile_interval_seconds=3600,
        schedules=[{"name": "tick", "cron": "* * * * * *", "task": "schema.noop"}],
    )
    with structlog.testing.capture_logs() as logs:
        async with running(settings, registry) as inst, http(inst) as client:
            # Due in a moment: made before the rename, claimed after it.
            r = await client.post("/api/v1/tasks", json={"name": "schema.noop", "delay_seconds": 1.5})
            assert r.status_code == 201, r.text
            async with renamed(direct, "tasks", "priority"):
                await wait_for(lambda: seen(inst, "task_claim_many"))
                await wait_for(lambda: seen(inst, "task_insert_many"))
                ready = await client.get("/readyz")
                assert ready.status_code == 503
                assert ready.json()["schema_mismatch"]["sqlstate"] == "42703"
            [claim] = events(logs, "schema_mismatch", operation="task_claim_many", count=1)
            assert (claim["log_level"], claim["sqlstate"]) == ("error", "42703")
            assert events(logs, "fetch_failed", operation="task_claim_many")
            # No request made a task after the rename: the scheduler's fire did.
            assert events(logs, "schema_mismatch", operation="task_insert_many", count=1)
            assert events(logs, "scheduler_error", operation="task_insert_many")
