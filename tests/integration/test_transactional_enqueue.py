"""Transactional enqueue: a task stored inside the application's own transaction.

``Client.enqueue(..., connection=conn)`` writes the task through the application's
asyncpg connection, in its transaction: rolled back, the task never existed and
nothing runs; committed, PostgreSQL tells the instances (``taskmesh_enqueued``) and
one pushes it at once, with no further call. The instances here sweep only every
60 s, so a task that runs within seconds was pushed by the notification.
"""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg
import pytest

from taskmesh.clients.client import Client
from taskmesh.errors import InvalidTaskError
from taskmesh.tasks.registry import Registry
from tests.conftest import REDIS_MODE, wait_for

pytestmark = pytest.mark.anyio


class Rollback(Exception):
    """Raised to roll the application's transaction back."""


def register(registry: Registry) -> list[int]:
    ran: list[int] = []

    @registry.task("tx.ship")
    async def ship(payload: dict[str, int]) -> None:
        ran.append(payload["order"])

    return ran


async def test_a_rolled_back_enqueue_leaves_no_task_and_a_committed_one_runs_at_once(
    start_instance: Any, registry: Registry, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    ran = register(registry)
    await pool.execute("CREATE TABLE IF NOT EXISTS app_orders (id int PRIMARY KEY)")
    await pool.execute("TRUNCATE app_orders")
    async with (
        start_instance(reconcile_interval_seconds=60),
        Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=registry) as client,
    ):
        app = await asyncpg.connect(database_url)
        try:
            with pytest.raises(Rollback):
                async with app.transaction():
                    await app.execute("INSERT INTO app_orders VALUES (1)")
                    await client.enqueue("tx.ship", {"order": 1}, connection=app)
                    raise Rollback
            assert await pool.fetchval("SELECT count(*) FROM tasks") == 0
            async with app.transaction():
                await app.execute("INSERT INTO app_orders VALUES (2)")
                shipped = await client.enqueue("tx.ship", {"order": 2}, connection=app)
                many = await client.enqueue_many(
                    [{"name": "tx.ship", "payload": {"order": n}} for n in (3, 4)], connection=app
                )
                # Not visible to anyone before the commit, and so not run.
                assert await pool.fetchval("SELECT count(*) FROM tasks") == 0
            t0 = time.monotonic()
            await wait_for(lambda: _completed(pool, 3), timeout=10)
            took = time.monotonic() - t0
        finally:
            await app.close()
    assert sorted(ran) == [2, 3, 4]
    assert took < 10  # pushed by the commit's notification, not by the 60 s sweep
    assert {shipped, *(e.task_id for e in many)} == {
        r["id"] for r in await pool.fetch("SELECT id FROM tasks WHERE status = 'completed'")
    }


async def test_a_connection_outside_a_transaction_is_refused_and_nothing_is_written(
    registry: Registry, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    async with Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=registry) as client:
        app = await asyncpg.connect(database_url)
        try:
            with pytest.raises(InvalidTaskError) as caught:
                await client.enqueue("tx.ship", {"order": 9}, connection=app)
        finally:
            await app.close()
    assert (caught.value.field, caught.value.message) == (
        "connection",
        "must be inside a transaction (async with connection.transaction(): ...)",
    )
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_an_application_connection_with_its_own_jsonb_codec_stores_the_payloads_as_sent(
    registry: Registry, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    """Applications often give asyncpg a JSON codec; a bulk enqueue through their connection must not use it."""
    async with Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=registry) as client:
        app = await asyncpg.connect(database_url)
        try:
            await app.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
            async with app.transaction():
                await client.enqueue_many(
                    [{"name": "tx.ship", "payload": {"order": n}} for n in range(100)], connection=app
                )
        finally:
            await app.close()
    payloads = await pool.fetch("SELECT payload FROM tasks ORDER BY (payload->>'order')::int")
    assert [json.loads(r["payload"]) for r in payloads] == [{"order": n} for n in range(100)]


async def _completed(pool: asyncpg.Pool, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'completed'") == n)
