"""PostgreSQL access: the asyncpg pool, the named queries of ``queries.sql``, migrations.

Migrations are the numbered files in ``migrations/`` (``0001_name.sql``), applied
in order, each in its own transaction, under ``pg_advisory_lock`` so that two
instances starting at once neither fail nor apply one twice (design.md section 4).
Applied versions are recorded in ``schema_migrations``.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

import asyncpg
import structlog

log = structlog.get_logger("taskmesh.postgres")

MIGRATION_LOCK_ID = 0x7461736B6D657368 & 0x7FFFFFFFFFFFFFFF  # "taskmesh" as a bigint
_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def queries() -> dict[str, str]:
    """The named blocks of ``queries.sql``: ``{"task_insert_many": "WITH ...", ...}``."""
    text = resources.files("taskmesh.store").joinpath("queries.sql").read_text()
    parts = _NAME_LINE.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def migrations() -> list[tuple[int, str, str]]:
    """The migration files as ``(version, name, sql)``, by version."""
    found = []
    for entry in resources.files("taskmesh.store").joinpath("migrations").iterdir():
        match = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text()))
    return sorted(found)


async def migrate(conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> list[int]:
    """Apply the migrations this database lacks.

    :param conn: a connection (not in a transaction); the advisory lock is
        session-level, so it must not come through PgBouncer in transaction mode.
    :returns: the versions applied now (empty when up to date).
    """
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_ID)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version integer PRIMARY KEY,
                   name text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        applied = []
        for version, name, sql in migrations():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
            log.info("migration_applied", version=version, migration=name)
            applied.append(version)
        return applied
    finally:
        try:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)
        except BaseException:
            # Pooled connections are not reset on release (see create_pool): a connection
            # whose unlock did not happen is closed, which releases the lock, never reused.
            conn.terminate()
            raise


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing to reset (see :func:`create_pool`)."""


async def create_pool(database_url: str, size: int = 10) -> asyncpg.Pool:
    """Open an asyncpg pool.

    taskmesh keeps no session state on pooled connections (as PgBouncer in
    transaction mode requires, design.md section 7), so a released connection
    skips asyncpg's reset query (advisory unlock, ``CLOSE ALL``, ``UNLISTEN *``,
    ``RESET ALL``): that is a round trip per statement on the hot path. asyncpg
    still rolls back a transaction left open. Code that takes session state
    (an advisory lock, ``LISTEN``, ``SET``) undoes it before the release
    (``await conn.reset()``).

    :param size: most connections (the least is 2).
    :raises OSError, asyncpg.PostgresError: the server does not answer or refuses.
    """
    pool = await asyncpg.create_pool(
        database_url,
        min_size=min(2, size),
        max_size=size,
        command_timeout=60,
        timeout=5,
        reset=_keep_session,
    )
    assert pool is not None
    return pool
