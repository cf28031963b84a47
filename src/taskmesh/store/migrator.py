"""Migrations: the numbered SQL files of ``migrations/``, applied in order, expand before contract.

Each file is ``NNNN_name.sql``; applied versions are recorded in ``schema_migrations``. A file
applies in a transaction of its own under ``pg_advisory_xact_lock``, so that two instances
starting at once neither fail nor apply one twice (docs/internals/design.md section 4). A
migration that fails with an error retrying cannot fix raises
:class:`~taskmesh.errors.MigrationError`.

The first lines of a file may carry directives (``-- taskmesh: <directive>``):

``contract``
    The file removes what the previous release still uses (an index its ``ON CONFLICT`` names,
    a column it reads). It is held back while an instance of another version is live (a
    ``workers`` row running or draining, heard from within :data:`LIVE_WINDOW_SECONDS`), and
    applied by the first ``taskmesh migrate`` (or instance start) after the last of them
    stopped. Every other file is an *expand* step: the previous release keeps working beside it.
``no-transaction``
    The file runs statement by statement outside a transaction (``CREATE INDEX CONCURRENTLY``,
    a copy in batches), under the session-level migration lock, released before the
    connection is. Its statements must be idempotent (``IF NOT EXISTS``), since a crash may
    leave some of them applied; an index a failed concurrent build left invalid is dropped by
    its ``DROP INDEX IF EXISTS`` line first. A copy in batches is a ``DO`` block that commits
    after each batch when the setting ``taskmesh.migrate_batches`` is ``on``, as it is here.
    Through a pooler in transaction mode (where the lock and the statements might land on
    different server connections) the file runs in one transaction instead, without
    ``CONCURRENTLY`` and without the commits between batches.

Log events: ``migration_applied`` (version, migration), ``migration_failed``, ``migration_held``
(version, migration, instances: the other versions' ``host:pid (version)``), ``migration_in_one_transaction``.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import anyio
import asyncpg

from taskmesh import __version__
from taskmesh.errors import MigrationError
from taskmesh.observability.logs import get_logger
from taskmesh.store.classify import POSTGRES_ERRORS, postgres_error
from taskmesh.store.sql import connect_options

__all__ = ["LIVE_WINDOW_SECONDS", "Migration", "MigrationRun", "migrate", "migrate_url", "migrations"]

log = get_logger("taskmesh.postgres")

MIGRATION_LOCK_ID = 0x7461736B6D657368 & 0x7FFFFFFFFFFFFFFF  # "taskmesh" as a bigint
LIVE_WINDOW_SECONDS = 120
"""An instance heard from (heartbeat) within this many seconds counts as live for a contract step:
well past the heartbeat interval of any lease setting in use (a third of the lease)."""

LOCK_POLL_SECONDS = 0.2
"""How often a ``no-transaction`` migration asks again for the migration lock another process holds."""

_DIRECTIVE = re.compile(r"^--\s*taskmesh:\s*([\w-]+)\s*$")
_KNOWN_DIRECTIVES = frozenset({"contract", "no-transaction"})


@dataclass(frozen=True)
class Migration:
    """One migration file.

    :param version: its number (``0019_fewer_index_entries.sql`` is 19).
    :param name: the rest of its file name, without ``.sql``.
    :param sql: its text.
    :param contract: it removes what the previous release uses (see module docs).
    :param transactional: it runs in one transaction (``False``: ``no-transaction``).
    """

    version: int
    name: str
    sql: str
    contract: bool = False
    transactional: bool = True

    def statements(self) -> list[str]:
        """The statements of a ``no-transaction`` file: split at each ``;`` that ends a line outside ``$$``."""
        statements, current, quoted = [], [], False
        for line in self.sql.splitlines():
            if not quoted and line.lstrip().startswith("--"):
                continue
            current.append(line)
            quoted ^= line.count("$$") % 2 == 1
            if not quoted and line.rstrip().endswith(";"):
                statements.append("\n".join(current).strip().removesuffix(";").strip())
                current = []
        if "\n".join(current).strip():
            statements.append("\n".join(current).strip())
        return [s for s in statements if s]


@dataclass
class MigrationRun:
    """What one :func:`migrate` did.

    :param applied: the versions applied now, in order.
    :param held: the contract versions held back, and why (``held_by``).
    :param held_by: the live instances of other versions, as ``host:pid (version)``.
    """

    applied: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    held_by: list[str] = field(default_factory=list)


def _parse(version: int, name: str, sql: str) -> Migration:
    directives = set()
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        match = _DIRECTIVE.match(line)
        if match:
            if match.group(1) not in _KNOWN_DIRECTIVES:
                raise ValueError(f"migration {version:04d}_{name}: unknown directive {match.group(1)!r}")
            directives.add(match.group(1))
    return Migration(version, name, sql, "contract" in directives, "no-transaction" not in directives)


def migrations() -> list[Migration]:
    """The migration files, by version.

    :raises ValueError: a file names a directive taskmesh does not know (a packaging bug).
    """
    found = []
    for entry in resources.files("taskmesh.store").joinpath("migrations").iterdir():
        match = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if match:
            found.append(_parse(int(match.group(1)), match.group(2), entry.read_text()))
    return sorted(found, key=lambda m: m.version)


async def other_versions_live(conn: Any, version: str = __version__) -> list[str]:
    """The live instances (see :data:`LIVE_WINDOW_SECONDS`) that run another version than ``version``.

    :returns: ``host:pid (version)`` each; empty on a database without a ``workers`` table yet.
    """
    if not await conn.fetchval("SELECT to_regclass('workers') IS NOT NULL"):
        return []
    rows = await conn.fetch(
        """SELECT host, pid, version FROM workers
           WHERE state IN ('running', 'draining') AND version <> $1
             AND heartbeat_at > now() - make_interval(secs => $2)
           ORDER BY started_at""",
        version,
        LIVE_WINDOW_SECONDS,
    )
    return [f"{r['host']}:{r['pid']} ({r['version']})" for r in rows]


async def migrate(conn: Any, *, pooler: str = "none") -> MigrationRun:
    """Apply the migrations this database lacks on ``conn`` (a connection of its own, not in a transaction).

    Each transactional migration runs in a transaction of its own that first takes the migration
    lock (``pg_advisory_xact_lock``) and looks again whether another instance applied it
    meanwhile. A transaction-level lock, unlike a session-level one, is released by the commit on
    the server connection that took it, so it cannot leak through a pooler in transaction mode
    (PgBouncer), where a session's statements may each run on another server connection.
    Contract migrations wait while instances of another version are live (module docs); the
    later expand migrations still apply (an expand step never depends on a contract step).

    :param pooler: ``transaction`` when ``conn`` goes through a transaction pooler: a
        ``no-transaction`` migration then runs in one transaction (module docs).
    :returns: what was applied and what was held back.
    :raises MigrationError: a migration failed with an error retrying cannot fix.
    :raises asyncpg.PostgresError, OSError: the connection failed (callers wrap it).
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_ID)
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version integer PRIMARY KEY,
                   name text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
    run = MigrationRun()
    for migration in migrations():
        if migration.version in done:
            continue
        if migration.contract:
            others = await other_versions_live(conn)
            if others:
                run.held.append(migration.version)
                run.held_by = others
                log.warning("migration_held", version=migration.version, migration=migration.name, instances=others)
                continue
        if await _apply(conn, migration, pooler):
            log.info("migration_applied", version=migration.version, migration=migration.name)
            run.applied.append(migration.version)
    return run


async def _apply(conn: Any, migration: Migration, pooler: str) -> bool:
    """Apply one migration; ``False`` when another process applied it while this one waited."""
    version, name = migration.version, migration.name
    if not migration.transactional and pooler == "transaction":
        # The session lock and the statements could land on different server connections: through
        # a transaction pooler the file runs in one transaction instead, its indexes built in it
        # (writes to the table wait for them). Straight to PostgreSQL they are built concurrently.
        log.info("migration_in_one_transaction", version=version, migration=name, reason="pg_pooler = transaction")
        migration = Migration(version, name, re.sub(r"\bCONCURRENTLY\s+", "", migration.sql), migration.contract)
    try:
        if migration.transactional:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_ID)
                if await conn.fetchval("SELECT 1 FROM schema_migrations WHERE version = $1", version):
                    return False
                await conn.execute(migration.sql)
                await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
            return True
        # Polled, not waited for: a session blocked in pg_advisory_lock holds a snapshot, which the
        # concurrent index build of the session holding the lock waits out: a deadlock.
        while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_ID):  # noqa: ASYNC110
            await anyio.sleep(LOCK_POLL_SECONDS)
        try:
            if await conn.fetchval("SELECT 1 FROM schema_migrations WHERE version = $1", version):
                return False
            await conn.execute("SET taskmesh.migrate_batches = on")
            for statement in migration.statements():
                await conn.execute(statement)
            await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
            return True
        finally:
            await conn.execute("RESET taskmesh.migrate_batches")
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)
    except POSTGRES_ERRORS as exc:
        error = postgres_error(f"migration {version:04d}_{name}", exc)
        if error.transient:
            raise
        log.error("migration_failed", version=version, migration=name, error=error.detail)
        raise MigrationError(version, name, error.detail) from exc


async def migrate_url(database_url: str, *, pooler: str = "none") -> MigrationRun:
    """Apply migrations through one short-lived connection (tests, ``taskmesh migrate``).

    :param pooler: see :meth:`~taskmesh.store.postgres.PgStore.connect`.
    :raises MigrationError: see :func:`migrate`.
    :raises StoreError: PostgreSQL did not answer or refused the connection.
    """
    try:
        conn = await asyncpg.connect(database_url, timeout=5, **connect_options(pooler))
    except POSTGRES_ERRORS as exc:
        raise postgres_error("connect", exc) from exc
    try:
        return await migrate(conn, pooler=pooler)
    except POSTGRES_ERRORS as exc:
        raise postgres_error("migrate", exc) from exc
    finally:
        with contextlib.suppress(*POSTGRES_ERRORS):
            await conn.close(timeout=2)
