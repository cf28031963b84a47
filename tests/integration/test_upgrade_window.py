"""Between an upgrade's expand and contract steps: what this release does on the schema both releases share."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from taskmesh.config import Settings
from taskmesh.store.migrator import migrate, migrations
from taskmesh.tasks.registry import Registry
from tests.conftest import http, running, scratch_database

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("redis_client")]


@pytest.fixture
async def held_database(store_urls: tuple[str, str]) -> AsyncIterator[str]:
    """A database migrated while an instance of the previous release is live: the contract steps wait."""
    async with scratch_database(store_urls[0], "tm_window") as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for m in migrations()[:2]:
                await conn.execute(m.sql)
                await conn.execute("INSERT INTO schema_migrations VALUES ($1, $2)", m.version, m.name)
            await conn.execute(
                "INSERT INTO workers (id, host, pid, queues, version, state)"
                " VALUES ('old-1', 'old', 1, '{}', '0.1.0', 'running')"
            )
            assert (await migrate(conn)).held == [m.version for m in migrations() if m.contract]
        finally:
            await conn.close()
        yield url


async def test_a_dedup_key_another_tenant_used_answers_409_naming_the_contract_step_until_it_has_run(
    held_database: str, make_settings: Callable[..., Settings], registry: Registry
) -> None:
    async with running(make_settings(database_url=held_database), registry) as inst, http(inst) as client:
        body: dict[str, Any] = {"name": "report.build", "dedup_key": "nightly", "tenant_id": "acme"}
        first = await client.post("/api/v1/tasks", json=body)
        assert first.status_code == 201, first.text
        again = await client.post("/api/v1/tasks", json=body)
        assert (again.status_code, again.json()["task_id"]) == (200, first.json()["task_id"])
        other = await client.post("/api/v1/tasks", json={**body, "tenant_id": "globex"})
        detail = (
            "dedup_key: a task of another tenant has this key; until the upgrade's contract step has run"
            " (`taskmesh migrate` once no instance of the previous release runs) a dedup key is unique across tenants"
        )
        assert other.status_code == 409, other.text
        assert other.json() == {
            "type": "about:blank",
            "title": "Dedup key in use",
            "status": 409,
            "detail": detail,
            "errors": [{"field": "dedup_key", "message": detail}],
        }
        pool = await asyncpg.connect(held_database)
        try:
            assert await pool.fetchval("SELECT count(*) FROM tasks") == 1  # nothing half-written
            await pool.execute("UPDATE workers SET state = 'stopped' WHERE id = 'old-1'")
            assert (await migrate(pool)).applied == [m.version for m in migrations() if m.contract]
        finally:
            await pool.close()
        after = await client.post("/api/v1/tasks", json={**body, "tenant_id": "globex"})
        assert after.status_code == 201, after.text
