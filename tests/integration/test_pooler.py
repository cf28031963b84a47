"""Through PgBouncer in transaction mode: a real PgBouncer of each test's own.

- five migrations at once through it apply each version once, and leave no lock behind
  (the next start does not wait);
- an instance with ``pg_pooler = "transaction"`` runs tasks while PgBouncer is restarted in
  the middle of the run, and loses none;
- with ``database_direct_url``, a task enqueued inside the application's transaction through
  PgBouncer is pushed at its commit, the notification heard on the direct connection;
- without ``LISTEN`` (no ``database_direct_url``), a schedule resumed over another instance's
  API fires at its next slot, the scheduler re-reading its table every ``pg_poll_seconds``,
  with no burst of slots it slept through.

``make test`` also runs a selection of the integration suite through a PgBouncer
(``TASKMESH_TEST_PG_POOLER=transaction``; see the Makefile).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.clients.client import Client
from taskmesh.store.postgres import migrate, migrations
from taskmesh.store.sql import connect_options
from taskmesh.tasks.registry import Registry
from tests.conftest import http, scratch_database, wait_for
from tests.pgbouncer import PgBouncer, through

pytestmark = pytest.mark.anyio
TRANSACTION = connect_options("transaction")


@pytest.fixture
def bouncer(store_urls: tuple[str, str]) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of the machine's PostgreSQL, for this test alone."""
    running = PgBouncer(store_urls[0])
    try:
        running.start()
        yield running
    finally:
        running.cleanup()


async def test_concurrent_migrations_through_pgbouncer_apply_each_version_once_and_leave_no_lock(
    store_urls: tuple[str, str], bouncer: PgBouncer
) -> None:
    async with scratch_database(store_urls[0], "tm_pool") as direct:
        url = through(direct, bouncer.address)
        applied: list[list[int]] = []

        async def one() -> None:
            conn = await asyncpg.connect(url, **TRANSACTION)
            try:
                applied.append((await migrate(conn, pooler="transaction")).applied)
            finally:
                await conn.close()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(one)
        versions = [m.version for m in migrations()]
        assert sorted(v for batch in applied for v in batch) == versions
        conn = await asyncpg.connect(direct)
        try:
            held = await conn.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
        finally:
            await conn.close()
        assert held == 0
        assert [r["version"] for r in rows] == versions
        # A later start finds the schema up to date at once: nothing waits on a leaked lock.
        conn = await asyncpg.connect(url, **TRANSACTION)
        try:
            with anyio.fail_after(5):
                assert (await migrate(conn, pooler="transaction")).applied == []
        finally:
            await conn.close()


async def test_tasks_run_through_pgbouncer_and_none_is_lost_when_it_restarts_mid_run(
    start_instance: Any, registry: Registry, database_url: str, bouncer: PgBouncer, pool: asyncpg.Pool
) -> None:
    done: list[int] = []

    @registry.task("pooled.work")
    async def work(payload: Any) -> int:
        await anyio.sleep(0.01)
        done.append(payload["n"])
        return int(payload["n"])

    total = 300
    url = through(database_url, bouncer.address)
    async with start_instance(database_url=url, pg_pooler="transaction", worker_concurrency=8) as inst:
        async with http(inst) as client:
            for start in range(0, total, 100):
                batch = [{"name": "pooled.work", "payload": {"n": n}} for n in range(start, start + 100)]
                answer = await client.post("/api/v1/tasks:batch", json={"tasks": batch})
                assert answer.status_code == 200 and answer.json()["created"] == 100, answer.text
            await wait_for(lambda: _completed_at_least(pool, total // 3), timeout=30)
            bouncer.stop()  # every server and client connection through it is cut
            await anyio.sleep(1.0)
            bouncer.start()
            await wait_for(functools.partial(_completed_at_least, pool, total), timeout=60)
            ready = await wait_for(lambda: _ready(client), timeout=15)
            assert ready
    statuses = {r["status"]: r["count"] for r in await pool.fetch("SELECT status, count(*) FROM tasks GROUP BY status")}
    assert statuses == {"completed": total}
    assert sorted(set(done)) == list(range(total))


async def test_a_resumed_schedule_fires_at_its_next_slot_without_listen(
    start_instance: Any, registry: Registry, database_url: str, bouncer: PgBouncer, pool: asyncpg.Pool
) -> None:
    @registry.task("pooled.tick")
    async def tick(payload: Any) -> None:
        return None

    schedule = {"name": "every-second", "cron": "* * * * * *", "task": "pooled.tick"}
    url = through(database_url, bouncer.address)
    settings = {"database_url": url, "pg_pooler": "transaction", "schedules": [schedule], "pg_poll_seconds": 0.5}
    # The pause and the resume go through another instance (no scheduler of its own): only a
    # NOTIFY, lost behind the pooler, or the poll tells the firing instance.
    other = {**settings, "scheduler_enabled": False, "workers_enabled": False}
    async with start_instance(**settings), start_instance(**other) as inst, http(inst) as client:
        assert (await client.post("/api/v1/schedules/every-second/pause")).status_code == 200
        await anyio.sleep(1.5)
        paused_count = await _fired(pool)
        await anyio.sleep(2.0)
        assert await _fired(pool) == paused_count  # nothing fires while paused
        resumed_at = datetime.now(UTC)
        assert (await client.post("/api/v1/schedules/every-second/resume")).status_code == 200
        first: datetime = await wait_for(functools.partial(_first_fire_after, pool, resumed_at), timeout=10)
        assert (first - resumed_at).total_seconds() < 2.5, (resumed_at, first)
        await anyio.sleep(3.0)
        # One task per second from the first on: no burst of slots the scheduler slept through.
        made = await pool.fetchval("SELECT count(*) FROM tasks WHERE name = 'pooled.tick' AND created_at >= $1", first)
    assert 3 <= made <= 5, made


async def test_with_a_direct_url_a_transactional_enqueue_through_pgbouncer_is_pushed_at_commit(
    start_instance: Any, registry: Registry, database_url: str, redis_url: str, prefix: str, bouncer: PgBouncer
) -> None:
    ran: list[int] = []

    @registry.task("pooled.ship")
    async def ship(payload: dict[str, int]) -> None:
        ran.append(payload["order"])

    url = through(database_url, bouncer.address)
    # The sweep comes only every 60 s: a task that runs within seconds was pushed by the NOTIFY.
    settings = {"database_url": url, "pg_pooler": "transaction", "database_direct_url": database_url}
    async with (
        start_instance(reconcile_interval_seconds=60, **settings),
        Client(url, redis_url, redis_prefix=prefix, registry=registry, pg_pooler="transaction") as client,
    ):
        app = await asyncpg.connect(url, **TRANSACTION)
        try:
            async with app.transaction():
                await client.enqueue("pooled.ship", {"order": 7}, connection=app)
            with anyio.fail_after(10):
                while not ran:
                    await anyio.sleep(0.02)
        finally:
            await app.close()
    assert ran == [7]


async def _completed_at_least(pool: asyncpg.Pool, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'completed'") >= n)


async def _ready(client: Any) -> bool:
    return bool((await client.get("/readyz")).status_code == 200)


async def _fired(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM tasks WHERE name = 'pooled.tick'"))


async def _first_fire_after(pool: asyncpg.Pool, after: datetime) -> datetime | None:
    value: datetime | None = await pool.fetchval(
        "SELECT min(created_at) FROM tasks WHERE name = 'pooled.tick' AND created_at > $1", after
    )
    return value
