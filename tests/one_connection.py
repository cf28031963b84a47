"""A PostgreSQL pool of one connection that fails code taking a second one while it holds the first.

A pool of two or more lets such code through whenever the other connection happens to be
free, which in a test is nearly always: code that must make do with one connection (a cron
fire, which holds its transaction's connection while it inserts the tasks) is only tested
by a pool where a second one is refused. Two ways are caught:

* the task holding a connection asks this pool for another one: :class:`SecondConnectionError`
  at once, naming the task;
* another task it waits on asks for one (the only connection is taken): the acquire gives up
  after :data:`ACQUIRE_WAIT_SECONDS` with :class:`SecondConnectionError` instead of hanging
  until the test's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import asyncpg
from asyncpg.pool import PoolAcquireContext, PoolConnectionProxy

from taskmesh.store.sql import connect_options

ACQUIRE_WAIT_SECONDS = 10.0
"""How long an acquire waits for the one connection: far longer than a fire holds it (milliseconds),
far shorter than the test's timeout."""


class SecondConnectionError(AssertionError):
    """Code under test took (or waited for) a second connection of a :class:`OneConnectionPool`."""


class _Acquire(PoolAcquireContext):
    """:meth:`asyncpg.Pool.acquire`'s context, refusing a second connection to a task that holds one.

    ``conn = await pool.acquire()`` (the inherited ``__await__``) is not tracked by task (its release
    may come from anywhere); it is still bounded by the one connection and the wait.
    """

    __slots__ = ("task",)

    def __init__(self, pool: OneConnectionPool, timeout: float | None) -> None:
        super().__init__(pool, timeout)
        self.task: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> PoolConnectionProxy:
        holders = cast(OneConnectionPool, self.pool).holders
        task = asyncio.current_task()
        if task is not None and task in holders:
            raise SecondConnectionError(f"task {task.get_name()!r} took a second pool connection while holding one")
        try:
            conn = await super().__aenter__()
        except TimeoutError as exc:
            raise SecondConnectionError(
                f"waited {ACQUIRE_WAIT_SECONDS} s for the pool's one connection: another task holds it"
                " while something waits for a second one"
            ) from exc
        if task is not None:
            holders.add(task)
            self.task = task
        return conn

    async def __aexit__(self, *exc: object) -> None:
        if self.task is not None:
            cast(OneConnectionPool, self.pool).holders.discard(self.task)
        await super().__aexit__(*exc)


class OneConnectionPool(asyncpg.Pool):
    """An :class:`asyncpg.Pool` of at most one connection (see the module docs)."""

    holders: set[asyncio.Task[Any]]

    def acquire(self, *, timeout: float | None = None) -> _Acquire:
        """The pool's connection for a task holding none of it (:class:`SecondConnectionError` otherwise)."""
        return _Acquire(self, ACQUIRE_WAIT_SECONDS if timeout is None else timeout)


@contextlib.asynccontextmanager
async def one_connection_pool(database_url: str, pooler: str = "none") -> AsyncIterator[OneConnectionPool]:
    """A :class:`OneConnectionPool` on ``database_url``, closed on exit.

    :param pooler: ``transaction`` when ``database_url`` is a PgBouncer in transaction mode.
    """
    pool = OneConnectionPool(
        database_url,
        min_size=1,
        max_size=1,
        max_queries=50_000,
        max_inactive_connection_lifetime=300.0,
        loop=None,
        connection_class=asyncpg.Connection,
        record_class=asyncpg.Record,
        **connect_options(pooler),
    )
    pool.holders = set()
    await pool
    try:
        yield pool
    finally:
        await pool.close()
