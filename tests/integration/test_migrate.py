"""Migrations: applied once, also when several instances start at the same moment."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import anyio
import asyncpg
import pytest

from taskmesh.store.classify import postgres_error
from taskmesh.store.postgres import migrate, migrations
from tests.conftest import scratch_database

pytestmark = pytest.mark.anyio


@pytest.fixture
async def empty_database(store_urls: tuple[str, str]) -> AsyncIterator[str]:
    async with scratch_database(store_urls[0], "tm_mig") as url:
        yield url


async def test_five_concurrent_migrations_apply_each_version_exactly_once(empty_database: str) -> None:
    applied: list[list[int]] = []

    async def one() -> None:
        conn = await asyncpg.connect(empty_database)
        try:
            applied.append((await migrate(conn)).applied)
        finally:
            await conn.close()

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(one)
    versions = [m.version for m in migrations()]
    assert sorted(v for batch in applied for v in batch) == versions
    conn = await asyncpg.connect(empty_database)
    rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    tables = {r["tablename"] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    await conn.close()
    assert [r["version"] for r in rows] == versions
    assert {"tasks", "task_runs", "workers", "schema_migrations"} <= tables


async def test_the_migrate_command_applies_then_reports_an_up_to_date_schema(empty_database: str) -> None:
    env = {"DATABASE_URL": empty_database, "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "taskmesh", "migrate"]
    first = await anyio.run_process(command, env=env, check=False)
    second = await anyio.run_process(command, env=env, check=False)
    assert first.returncode == 0, first.stderr
    assert first.stdout.decode().strip() == f"migrations applied: {[m.version for m in migrations()]}"
    assert second.returncode == 0
    assert second.stdout.decode().strip() == "migrations applied: none, schema is up to date"


PREVIOUS_CONFLICT_TARGETS = {
    "before per-tenant dedup keys": "ON CONFLICT (idempotency_key) DO NOTHING",
    "before the index of keyed tasks only": "ON CONFLICT (idempotency_key, (COALESCE(tenant_id, ''))) DO NOTHING",
}
"""The ``ON CONFLICT`` targets earlier releases' creates name, each a unique index some migration replaced."""


async def previous_creates_work(conn: asyncpg.Connection) -> dict[str, bool]:
    """Whether each earlier release's create statement still finds its unique index."""
    works = {}
    for release, target in PREVIOUS_CONFLICT_TARGETS.items():
        try:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO tasks (id, name, type, queue, priority, payload, idempotency_key, max_retries,"
                    " status, run_at)"
                    f" VALUES (gen_random_uuid(), 'n', 'immediate', 'q', 0, '{{}}', 'k', 0, 'queued', now()) {target}"
                )
            works[release] = True
        except asyncpg.InvalidColumnReferenceError:
            works[release] = False
    return works


async def test_contract_steps_wait_while_an_instance_of_another_version_is_live(empty_database: str) -> None:
    conn = await asyncpg.connect(empty_database)
    try:
        contract = [m.version for m in migrations() if m.contract]
        assert contract, "no contract migration: this test guards none"
        # An instance of an older release is live on the schema as it knew it.
        await conn.execute(
            """CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                                               applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        for m in migrations():
            if m.version <= 2:
                await conn.execute(m.sql)
                await conn.execute("INSERT INTO schema_migrations VALUES ($1, $2)", m.version, m.name)
        await conn.execute(
            "INSERT INTO workers (id, host, pid, queues, version, state)"
            " VALUES ('old-1', 'old', 1, '{}', '0.1.0', 'running')"
        )
        held = await migrate(conn)
        assert held.applied == [m.version for m in migrations() if m.version > 2 and not m.contract]
        assert held.held == contract
        assert held.held_by == ["old:1 (0.1.0)"]
        assert await previous_creates_work(conn) == dict.fromkeys(PREVIOUS_CONFLICT_TARGETS, True)
        # Still live: held again. Gone (stopped): the contract steps apply, and the old targets are gone.
        assert (await migrate(conn)).held == contract
        await conn.execute("UPDATE workers SET state = 'stopped'")
        assert (await migrate(conn)).applied == contract
        assert await previous_creates_work(conn) == dict.fromkeys(PREVIOUS_CONFLICT_TARGETS, False)
    finally:
        await conn.close()


async def test_a_plan_a_migration_outdated_under_a_transaction_is_an_outage_that_the_next_call_outlives(
    empty_database: str,
) -> None:
    instance = await asyncpg.connect(empty_database)
    migration = await asyncpg.connect(empty_database)
    try:
        await instance.execute("CREATE TABLE t (x integer)")
        statement = "SELECT * FROM t"
        await instance.fetch(statement)  # prepared and cached, as the store's named statements are
        await migration.execute("ALTER TABLE t ADD COLUMN y integer")
        with pytest.raises(asyncpg.exceptions.InvalidCachedStatementError) as caught:
            async with instance.transaction():
                await instance.fetch(statement)
        error = postgres_error("task_claim_many", caught.value)
        assert error.transient and not error.schema_mismatch
        async with instance.transaction():  # the retry the transient error asks for
            assert await instance.fetch(statement) == []
    finally:
        await instance.close()
        await migration.close()
