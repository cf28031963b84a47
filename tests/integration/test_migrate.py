"""Migrations: applied once, also when several instances start at the same moment."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import anyio
import asyncpg
import pytest

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
            applied.append(await migrate(conn))
        finally:
            await conn.close()

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(one)
    versions = [v for v, _, _ in migrations()]
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
    assert first.stdout.decode().strip() == f"migrations applied: {[v for v, _, _ in migrations()]}"
    assert second.returncode == 0
    assert second.stdout.decode().strip() == "migrations applied: none, schema is up to date"
