"""The PostgreSQL store: the asyncpg pool, transactions, and the typed queries.

:class:`PgStore` is the only holder of the pool. Its ``tasks``, ``workers``, ``queues`` and
``schedules`` attributes run the named blocks of ``queries.sql`` (one method
per block); :meth:`PgStore.transaction` gives the same attributes bound to
one connection inside one transaction. Every failure is a
:class:`~taskmesh.errors.StoreError` naming the operation, transient or not, and goes
through the store's :class:`~taskmesh.store.schema_watch.SchemaWatch`, shared by its
transactions, which counts and logs a statement the schema refused.

Migrations are applied by ``store/migrator.py`` (:meth:`PgStore.migrate` at an instance's start).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from datetime import datetime
from typing import Any

import anyio
import asyncpg

from taskmesh.observability.logs import get_logger
from taskmesh.store.audit_queries import AuditQueries
from taskmesh.store.classify import POSTGRES_ERRORS, postgres_error
from taskmesh.store.key_queries import KeyQueries
from taskmesh.store.limit_queries import LimitQueries
from taskmesh.store.migrator import MigrationRun, migrate, migrate_url, migrations
from taskmesh.store.operation_queries import OperationQueries
from taskmesh.store.queue_queries import QueueQueries
from taskmesh.store.schedule_queries import ScheduleQueries
from taskmesh.store.schema_watch import SchemaWatch
from taskmesh.store.search_queries import SearchQueries
from taskmesh.store.session_queries import SessionQueries
from taskmesh.store.sql import Executor, connect_options, queries
from taskmesh.store.task_queries import TaskQueries
from taskmesh.store.worker_queries import WorkerQueries
from taskmesh.store.workflow_queries import WorkflowQueries

BEFORE_COMMIT: ContextVar[Callable[[PgStore], Awaitable[None]] | None] = ContextVar(
    "taskmesh_before_commit", default=None
)
"""A step every transaction of the current context runs just before it commits (the audit log's row:
``taskmesh.security.audit``); ``None``: none."""

__all__ = ["Listener", "PgStore", "migrate", "migrate_url", "migrations", "queries"]

log = get_logger("taskmesh.postgres")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing to reset (see :meth:`PgStore.connect`)."""


class PgStore:
    """PostgreSQL, as taskmesh uses it (see module docs).

    :param pool: the instance's pool.
    :param executor: what queries run on: the pool (default) or a connection in a transaction.
    :param watch: where its failures are recorded; ``None``: a watch of its own (no metric).
    """

    def __init__(
        self, pool: asyncpg.Pool, executor: Executor | None = None, *, watch: SchemaWatch | None = None
    ) -> None:
        self.pool = pool
        ex = executor if executor is not None else pool
        self._ex = ex
        self.watch = watch if watch is not None else SchemaWatch()
        w = self.watch
        self.tasks = TaskQueries(ex, w)
        self.workers = WorkerQueries(ex, w)
        self.schedules = ScheduleQueries(ex, w)
        self.queues = QueueQueries(ex, w)
        self.search = SearchQueries(ex, w)
        self.operations = OperationQueries(ex, w)
        self.keys = KeyQueries(ex, w)
        self.audit = AuditQueries(ex, w)
        self.sessions = SessionQueries(ex, w)
        self.workflows = WorkflowQueries(ex, w)
        self.limits = LimitQueries(ex, w)

    def on(self, connection: Executor) -> PgStore:
        """This store's queries on ``connection`` (a caller's own, inside its transaction), sharing its watch."""
        return PgStore(self.pool, connection, watch=self.watch)

    @classmethod
    async def connect(
        cls, database_url: str, size: int = 10, *, pooler: str = "none", watch: SchemaWatch | None = None
    ) -> PgStore:
        """Open a pool of at most ``size`` connections (at least 2 are kept open).

        :param pooler: ``transaction`` when ``database_url`` is a pooler in transaction mode
            (PgBouncer): asyncpg keeps no named prepared statements, which another client's
            transaction would meet on the same server connection (``statement_cache_size=0``).
        :param watch: where the store's failures are recorded (the instance's, with its metric and
            ``/readyz``); ``None``: a watch of its own.

        taskmesh keeps no session state on pooled connections (as PgBouncer in
        transaction mode requires, docs/internals/design.md section 7), so a released connection
        skips asyncpg's reset query (advisory unlock, ``CLOSE ALL``, ``UNLISTEN *``,
        ``RESET ALL``): that is a round trip per statement on the hot path. asyncpg
        still rolls back a transaction left open. Code that takes session state
        (the migration lock) undoes it before the release.

        :raises StoreError: the server does not answer (transient) or refuses the
            login or database (not transient).
        """
        try:
            pool = await asyncpg.create_pool(
                database_url,
                min_size=min(2, size),
                max_size=size,
                command_timeout=60,
                timeout=5,
                reset=_keep_session,
                **connect_options(pooler),
            )
        except POSTGRES_ERRORS as exc:
            raise postgres_error("connect", exc) from exc
        assert pool is not None
        return cls(pool, watch=watch)

    async def close(self, timeout: float = 3.0) -> None:  # noqa: ASYNC109  # a bound on close, not a timeout of the caller
        """Close the pool; after ``timeout`` seconds (a dead server) terminate it instead."""
        self.watch.flush()
        with anyio.move_on_after(timeout) as waited:
            try:
                await self.pool.close()
            except POSTGRES_ERRORS:
                self.pool.terminate()
        if waited.cancelled_caught:  # a dead server cannot hold the exit
            self.pool.terminate()

    def terminate(self) -> None:
        """Close every connection at once (an exit that cannot wait)."""
        self.pool.terminate()

    @contextlib.asynccontextmanager
    async def transaction(
        self, *, lock_timeout_ms: int | None = None, idle_timeout_ms: int | None = None
    ) -> AsyncIterator[PgStore]:
        """One connection, one transaction: yields a :class:`PgStore` bound to it.

        Committed when the block ends, rolled back when it raises.

        :param lock_timeout_ms: ``lock_timeout`` for this transaction (a wait on a row lock
            past it fails with a transient error instead of waiting for ever).
        :param idle_timeout_ms: ``idle_in_transaction_session_timeout``: when this client
            goes silent mid-transaction (cut off, frozen), PostgreSQL ends the session and
            releases its locks after this long, so other instances carry on.
        :raises StoreError: acquiring, beginning or committing failed.
        """
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                if lock_timeout_ms is not None or idle_timeout_ms is not None:
                    await conn.execute(
                        "SELECT set_config('lock_timeout', $1, true),"
                        " set_config('idle_in_transaction_session_timeout', $2, true)",
                        f"{lock_timeout_ms or 0}ms",
                        f"{idle_timeout_ms or 0}ms",
                    )
                tx = PgStore(self.pool, conn, watch=self.watch)
                yield tx
                hook = BEFORE_COMMIT.get()
                if hook is not None:
                    await hook(tx)
        except POSTGRES_ERRORS as exc:
            raise self.watch.error("transaction", exc) from exc

    @contextlib.asynccontextmanager
    async def changing(self) -> AsyncIterator[PgStore]:
        """Where a change is made: a transaction when the current context records its changes
        (:data:`BEFORE_COMMIT` is set: an API request, whose audit row then commits with the change),
        else this store as it is (each statement commits alone, with no extra round trips).

        :raises StoreError: as :meth:`transaction`.
        """
        if BEFORE_COMMIT.get() is None or self._ex is not self.pool:
            yield self
            return
        async with self.transaction() as tx:
            yield tx

    @contextlib.asynccontextmanager
    async def atomic(self) -> AsyncIterator[PgStore]:
        """A transaction: this store when it is one already, else a new one (:meth:`transaction`).

        :raises StoreError: as :meth:`transaction`.
        """
        if self._ex is not self.pool:
            yield self
            return
        async with self.transaction() as tx:
            yield tx

    async def ping(self, timeout: float | None = None) -> None:  # noqa: ASYNC109  # asyncpg's own, see below
        """``SELECT 1``.

        :param timeout: seconds; asyncpg's own timeout, which cancels the query cleanly
            (cancelling the call from outside can leave the pooled connection confused).
        :raises StoreError: PostgreSQL did not answer (in time).
        """
        try:
            await self._ex.fetchval("SELECT 1", timeout=timeout)
        except POSTGRES_ERRORS as exc:
            raise self.watch.error("ping", exc) from exc

    async def now(self) -> datetime:
        """PostgreSQL's clock (``clock_timestamp()``), the clock of record for due times.

        :raises StoreError: PostgreSQL did not answer.
        """
        try:
            value: datetime = await self._ex.fetchval("SELECT clock_timestamp()")
        except POSTGRES_ERRORS as exc:
            raise self.watch.error("now", exc) from exc
        return value

    async def notify(self, channel: str, payload: str) -> None:
        """``pg_notify(channel, payload)`` (sent at commit when inside a transaction).

        :raises StoreError: PostgreSQL did not answer.
        """
        try:
            await self._ex.execute("SELECT pg_notify($1, $2)", channel, payload)
        except POSTGRES_ERRORS as exc:
            raise self.watch.error("notify", exc) from exc

    async def migrate(self, *, pooler: str = "none") -> MigrationRun:
        """Apply the migrations this database lacks, under the advisory lock (``store/migrator.py``).

        :param pooler: the pool's ``pg_pooler`` (a ``no-transaction`` migration refuses a transaction pooler).
        :returns: the versions applied now and the contract versions held back.
        :raises MigrationError: a migration failed with an error retrying cannot fix
            (a syntax error, an object that already exists); nothing of it was applied.
        :raises StoreError: PostgreSQL did not answer (transient: retry).
        """
        try:
            async with self.pool.acquire() as conn:
                return await migrate(conn, pooler=pooler)
        except POSTGRES_ERRORS as exc:
            raise postgres_error("migrate", exc) from exc


class Listener:
    """A ``LISTEN`` on a connection of its own, outside the pool (the scheduler's wake-ups).

    :param database_url: where to connect.
    :param channel: the channel to listen on.
    :param callback: called (on the event loop) with the notification's payload, and with
        ``LOST`` when PostgreSQL closes the connection (so the owner wakes and reopens it at
        once instead of staying deaf until its next wake-up).
    """

    LOST = "\x00lost"
    """The payload given to the callback when the connection is lost (no notification has it)."""

    def __init__(self, database_url: str, channel: str, callback: Callable[[str], None]) -> None:
        self._url = database_url
        self._channel = channel
        self._callback = callback
        self._conn: asyncpg.Connection | None = None

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        self._callback(str(payload))

    def _terminated(self, _conn: Any) -> None:
        self._callback(self.LOST)

    @property
    def open(self) -> bool:
        """Whether the connection is up (PostgreSQL may drop it at any time)."""
        return self._conn is not None and not self._conn.is_closed()

    async def ensure(self, connect: Callable[[], Awaitable[asyncpg.Connection]] | None = None) -> None:
        """(Re)open the connection and ``LISTEN`` when it is not open.

        :param connect: opens the connection (tests inject one; default ``asyncpg.connect``).
        :raises StoreError: PostgreSQL did not answer.
        """
        if self.open:
            return
        await self.close()
        try:
            conn = await (connect() if connect is not None else asyncpg.connect(self._url, timeout=5))
        except POSTGRES_ERRORS as exc:
            raise postgres_error("listen_connect", exc) from exc
        try:
            await conn.add_listener(self._channel, self._notified)
            conn.add_termination_listener(self._terminated)
        except BaseException as exc:
            conn.terminate()
            if isinstance(exc, POSTGRES_ERRORS):
                raise postgres_error("listen", exc) from exc
            raise
        self._conn = conn

    async def close(self) -> None:
        """Close the connection (at most a second, then terminate it)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await conn.close(timeout=1)
        except POSTGRES_ERRORS:
            conn.terminate()
