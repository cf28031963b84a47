"""An instance's start on its stores: connect, measure PostgreSQL's clock and migrate, through outages.

PostgreSQL and Redis are tried side by side; an outage is logged once per store
(``store_unavailable``) and backed off (:class:`~taskmesh.services.base.Outage`), a refusal retrying
cannot fix becomes the configuration error it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import anyio

from taskmesh.config import Settings
from taskmesh.errors import ConfigError, MigrationError, StoreError
from taskmesh.runtime.clock import StoreClock
from taskmesh.services.base import Outage, call_until_done
from taskmesh.store import PgStore, RedisStore, Stores
from taskmesh.store.keys import Keys
from taskmesh.store.schema_watch import SchemaWatch


async def connect_until_stopped(
    settings: Settings,
    database_url: str,
    redis_url: str,
    clock: StoreClock,
    stop: anyio.Event,
    startup: dict[str, str],
    schema: SchemaWatch | None = None,
) -> Stores | None:
    """Connect, measure PostgreSQL's clock and migrate, through outages; ``None`` when stopped first.

    PostgreSQL and Redis are tried side by side, each store's state kept in ``startup``
    (``connecting``, ``down``, ``ok``) for ``/readyz``, so that it names only the one that failed.
    ``schema`` records the PostgreSQL store's failures (see :meth:`PgStore.connect`).

    :raises MigrationError: a migration failed for good.
    :raises ConfigError: a store refused the connection in a way retrying cannot fix (a refused
        password, a wrong database name, a failed TLS handshake, a Redis Cluster node; see
        ``RedisStore.check_server``): the message names ``database_url`` or ``redis_url``.
    :raises StoreError: a store failed for good after connecting (a query PostgreSQL refused).
    """
    result: list[Stores] = []
    failed: list[Exception] = []  # raised after the group: a child's error would come wrapped
    redis = RedisStore.connect(redis_url, Keys(settings.redis_prefix), mode=settings.redis_mode, now_ms=clock.now_ms)

    def down(store: str) -> Callable[[StoreError], None]:
        return lambda exc: startup.__setitem__(store, "down")

    async def open_postgres() -> PgStore:
        outage = Outage("postgres")
        while True:
            try:
                pg = await PgStore.connect(database_url, settings.pg_pool_size, pooler=settings.pg_pooler, watch=schema)
                break
            except StoreError as exc:
                if not exc.transient:
                    raise
                startup["postgres"] = "down"
                await outage.failed(exc)
        outage.recovered()
        try:
            await call_until_done("postgres", lambda: clock.sync(pg.now), on_failure=down("postgres"))
            if settings.migrate_on_start:
                await call_until_done(
                    "postgres", functools.partial(pg.migrate, pooler=settings.pg_pooler), on_failure=down("postgres")
                )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await pg.close()
            raise
        startup["postgres"] = "ok"
        return pg

    async def check_redis() -> None:
        await call_until_done("redis", redis.check_server, on_failure=down("redis"))
        startup["redis"] = "ok"

    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await stop.wait()
            tg.cancel_scope.cancel()

        async def connect() -> None:
            pg: list[PgStore] = []
            try:
                async with anyio.create_task_group() as both:
                    both.start_soon(check_redis)

                    async def postgres() -> None:
                        pg.append(await open_postgres())

                    both.start_soon(postgres)
            except* (MigrationError, StoreError) as group:
                failed.extend(
                    refused_for_good(e) for e in group.exceptions if isinstance(e, MigrationError | StoreError)
                )
            if failed:
                with anyio.CancelScope(shield=True):
                    for store in pg:
                        await store.close()
            else:
                result.append(Stores(pg[0], redis))
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(connect)
    if not result:
        with anyio.CancelScope(shield=True):
            await redis.close()
    if failed:
        raise failed[0]
    return result[0] if result else None


def refused_for_good(exc: MigrationError | StoreError) -> Exception:
    """A store's refusal to connect as the config error it is (exit 2, naming the setting)."""
    if not isinstance(exc, StoreError) or exc.transient or exc.operation != "connect":
        return exc
    if exc.store == "redis":
        return ConfigError(exc.detail)  # check_server's message names redis_url already
    return ConfigError(f"database_url: PostgreSQL refused the connection ({exc.detail})")
