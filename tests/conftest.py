"""Shared fixtures: real PostgreSQL and Redis, a fresh database per session, a key prefix per test.

The machine's servers are used when TASKMESH_TEST_DATABASE_URL (an admin URL:
the test creates and drops its own database) and TASKMESH_TEST_REDIS_URL are
set, as .ci/run does; otherwise embedded servers are started for the session.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from taskmesh.config import Settings, load_settings
from taskmesh.observability.logs import configure
from taskmesh.runtime import supervisor
from taskmesh.runtime.clock import StoreClock
from taskmesh.store import PgStore, RedisStore, Stores
from taskmesh.store.keys import Keys
from taskmesh.store.postgres import migrate_url
from taskmesh.store.redis_clients import open_client
from taskmesh.store.redis_types import RedisMode
from taskmesh.store.sql import connect_options
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from tests.pgbouncer import PgBouncer, through
from tests.proc import free_port
from tests.redis_topologies import Cluster, SentinelSet, started
from tests.tools import require_tool


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    configure(os.environ.get("TASKMESH_TEST_LOG_LEVEL", "warning"), "console")
    return "asyncio"


@pytest.fixture(scope="session")
def store_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    db = os.environ.get("TASKMESH_TEST_DATABASE_URL")
    rd = os.environ.get("TASKMESH_TEST_REDIS_URL")
    if db and rd:
        yield db, rd
        return
    from taskmesh.dev.stack import embedded_stores

    with embedded_stores(db, rd, root=tmp_path_factory.mktemp("stores")) as urls:
        yield urls


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@contextlib.asynccontextmanager
async def scratch_database(admin: str, prefix: str) -> AsyncIterator[str]:
    """A new empty database on the server of ``admin``, dropped on exit; yields its URL."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    conn = await asyncpg.connect(admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    try:
        yield with_database(admin, name)
    finally:
        conn = await asyncpg.connect(admin)
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


POOLER = os.environ.get("TASKMESH_TEST_PG_POOLER", "none")
"""``transaction``: the tests reach PostgreSQL through a PgBouncer in transaction mode started for
the session, and instances run with ``pg_pooler = "transaction"`` (``make test``'s pooler suite)."""


@pytest.fixture(scope="session")
def pgbouncer_address(store_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """``host:port`` of the session's PgBouncer, or ``None`` when the tests talk to PostgreSQL itself."""
    if POOLER == "none":
        yield None
        return
    bouncer = PgBouncer(store_urls[0])
    try:
        bouncer.start()
        yield bouncer.address
    finally:
        bouncer.cleanup()


@pytest.fixture(scope="session")
async def database_url(store_urls: tuple[str, str], pgbouncer_address: str | None) -> AsyncIterator[str]:
    async with scratch_database(store_urls[0], "tm_test") as url:
        await migrate_url(url)
        yield url if pgbouncer_address is None else through(url, pgbouncer_address)


REDIS_TOPOLOGY = os.environ.get("TASKMESH_TEST_REDIS_TOPOLOGY", "standalone")
"""``cluster``: the tests' Redis is a 3-master Redis Cluster started for the session, and instances
run with ``redis_mode = "cluster"``; ``sentinel``: a master, a replica and three Sentinels, reached
through a ``redis+sentinel://`` URL (``make test``'s cluster and Sentinel suites)."""
REDIS_MODE: RedisMode = "cluster" if REDIS_TOPOLOGY == "cluster" else "standalone"


@pytest.fixture(scope="session")
def redis_topology() -> Iterator[Cluster | SentinelSet | None]:
    """The session's Redis Cluster or Sentinel set (:data:`REDIS_TOPOLOGY`), or ``None``."""
    if REDIS_TOPOLOGY == "standalone":
        yield None
        return
    with started(Cluster() if REDIS_TOPOLOGY == "cluster" else SentinelSet()) as topology:
        yield topology


@pytest.fixture
def redis_url(store_urls: tuple[str, str], redis_topology: Cluster | SentinelSet | None) -> str:
    return store_urls[1] if redis_topology is None else redis_topology.url


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the session's database, for tests that look at rows directly; the tables start empty."""
    p = await asyncpg.create_pool(database_url, min_size=1, max_size=10, **connect_options(POOLER))
    assert p is not None
    await p.execute("TRUNCATE tasks, workflows, workers, queues, queue_minutes, operations, api_keys, limits CASCADE")
    await empty_audit_log(p)
    yield p
    await p.close()


async def empty_audit_log(pool: asyncpg.Pool) -> None:
    """Empty ``audit_events``, whose triggers refuse TRUNCATE: as a superuser, with them skipped."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica; TRUNCATE audit_events")


@pytest.fixture
def prefix() -> str:
    return f"tmtest:{secrets.token_hex(4)}"


@pytest.fixture
async def redis_client(redis_url: str, prefix: str) -> AsyncIterator[aioredis.Redis]:
    """A decoding client for tests that look at keys directly; the prefix's keys are deleted after."""
    # On a cluster the client is a cluster one; the tests use the commands both kinds share.
    client = cast(aioredis.Redis, open_client(redis_url, REDIS_MODE, decode=True))
    yield client
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.fixture
def store_clock() -> StoreClock:
    """The clock ``stores``' Redis side reads "now" from, as an instance's does.

    A test moves ``offset`` forward to make a delay expire without sleeping.
    """
    return StoreClock()


@pytest.fixture
async def stores(
    pool: asyncpg.Pool, redis_url: str, keys: Keys, redis_client: aioredis.Redis, store_clock: StoreClock
) -> AsyncIterator[Stores]:
    """The stores as an instance has them (the PostgreSQL side on ``pool``, Redis's "now" from ``store_clock``)."""
    redis = RedisStore.connect(redis_url, keys, mode=REDIS_MODE, now_ms=store_clock.now_ms)
    yield Stores(PgStore(pool), redis)
    await redis.close()


@pytest.fixture
async def tasks(stores: Stores, registry: Registry) -> Tasks:
    return Tasks(stores.pg, stores.redis, registry=registry)


@pytest.fixture
def make_settings(database_url: str, redis_url: str, prefix: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": database_url,
            "redis_url": redis_url,
            "redis_prefix": prefix,
            "http_port": 0,
            "log_level": "warning",
            "shutdown_grace_seconds": 5,
            "reconcile_interval_seconds": 1,
            "reclaim_interval_seconds": 0.5,
            "delayed_poll_seconds": 0.05,
            "migrate_on_start": False,
            "pg_pooler": POOLER,
            "redis_mode": REDIS_MODE,
        }
        values.update(overrides)
        return load_settings(**values)

    return make


@contextlib.asynccontextmanager
async def running(settings: Settings, registry: Registry) -> AsyncIterator[supervisor.Instance]:
    """Run an instance in this event loop until the block ends (graceful stop)."""
    inst = supervisor.Instance()
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(supervisor.run, settings, registry, inst, signals=False))
        with anyio.fail_after(20):
            await inst.ready.wait()
        # The reconciler's first look at a fresh prefix resyncs Redis; let it finish, so
        # that a test's own pushes and deletes do not race it.
        assert settings.redis_url is not None
        client = open_client(settings.redis_url, settings.redis_mode)
        markers = [Keys(settings.redis_prefix).marker(q) for q in settings.queue_names]
        try:
            with anyio.fail_after(10):
                while not all([await client.exists(m) for m in markers]):
                    await anyio.sleep(0.02)
        finally:
            await client.aclose()
        try:
            yield inst
        finally:
            inst.stop.set()


@pytest.fixture
def start_instance(
    make_settings: Callable[..., Settings], registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis
) -> Callable[..., contextlib.AbstractAsyncContextManager[supervisor.Instance]]:
    # ``pool`` empties the tables first: an instance's first resync must not carry an
    # earlier test's queued tasks into this test's Redis prefix. ``redis_client`` is torn
    # down after every instance of the test, so its sweep of the prefix's keys is the last word.
    def start(**overrides: Any) -> contextlib.AbstractAsyncContextManager[supervisor.Instance]:
        return running(make_settings(**overrides), registry)

    return start


def http(inst: supervisor.Instance) -> httpx.AsyncClient:
    """An HTTP client for a running instance; its bodies are JSON (``Content-Type`` set, as the API requires)."""
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{inst.port}", timeout=10, headers={"Content-Type": "application/json"}
    )


async def wait_for(check: Callable[[], Awaitable[Any]], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await anyio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s; last value: {last!r}")


@contextlib.contextmanager
def redis_server(*args: str, tls: bool = False) -> Iterator[int]:
    """A ``redis-server`` of its own on a free loopback port (no persistence), with ``args``; yields the port.

    :param tls: the port speaks TLS only (``args`` name the certificate and key).
    Ready once the port accepts connections (so a TLS-only server counts too); stopped on exit.
    Skips the test when ``redis-server`` is not on PATH (fails it under ``TASKMESH_TEST_REQUIRE_TOOLS``).
    """
    server = require_tool("redis-server", "Debian package redis-server", "no Redis of the test's own was started")
    port = free_port()
    listen = ["--port", "0", "--tls-port", str(port)] if tls else ["--port", str(port)]
    command = [server, *listen, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *args]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def redis_with_password() -> Iterator[str]:
    """``host:port`` of a Redis of its own that requires the password ``s3cret``."""
    with redis_server("--requirepass", "s3cret") as port:
        yield f"127.0.0.1:{port}"
