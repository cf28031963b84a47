"""The named SQL blocks of ``queries.sql`` and the base of the typed query classes.

Every call goes through :class:`Queries`, whose helpers turn any asyncpg or
socket failure into a :class:`~taskmesh.errors.StoreError` naming the block,
classified as transient or not (``store/classify.py``), and hand it to the store's
:class:`~taskmesh.store.schema_watch.SchemaWatch` (a statement the schema refused is
counted and logged there). Nothing outside ``taskmesh.store`` sees asyncpg's exceptions.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, Sequence
from functools import cache
from importlib import resources
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from taskmesh.errors import StoreError
from taskmesh.store.classify import POSTGRES_ERRORS, postgres_error
from taskmesh.store.schema_watch import SchemaWatch

Executor = asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy
"""What a query runs on: the pool (one statement, autocommit) or a connection (inside a transaction)."""

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def connect_options(pooler: str) -> dict[str, Any]:
    """asyncpg's connection options for ``pooler`` (``none`` or ``transaction``; see :meth:`PgStore.connect`).

    Straight to PostgreSQL, each statement is prepared once per connection and, after its fifth
    run, PostgreSQL may cache a generic plan for it: the hot statements are written so that plan
    looks rows up by primary key, never by an index of the whole backlog (the growth test reads
    the rows each one touches beside a backlog). Behind a transaction pooler statements are
    unnamed and planned each time.
    """
    return {"statement_cache_size": 0} if pooler == "transaction" else {}


SQL_FILES = ("queries.sql", "workflows.sql", "limits.sql")
"""The files of named blocks, one namespace (a block's name is unique across them)."""


@cache
def queries() -> dict[str, str]:
    """The named blocks of :data:`SQL_FILES`: ``{"task_insert_many": "WITH ...", ...}``."""
    found: dict[str, str] = {}
    for file in SQL_FILES:
        text = resources.files("taskmesh.store").joinpath(file).read_text()
        parts = _NAME_LINE.split(text)
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            assert name not in found, f"{file}: block {name} is named twice"
            found[name] = body.strip().rstrip(";")
    return found


class Queries:
    """Base of the per-entity query classes: runs named blocks on one executor.

    :param executor: the pool, or a connection whose transaction the caller owns.
    :param watch: where failures are recorded (the store's); ``None``: nowhere.
    """

    def __init__(self, executor: Executor, watch: SchemaWatch | None = None) -> None:
        self._ex = executor
        self._q = queries()
        self._watch = watch

    def _failed(self, name: str, exc: BaseException) -> StoreError:
        return self._watch.error(name, exc) if self._watch is not None else postgres_error(name, exc)

    async def _call(self, method: str, name: str, args: tuple[Any, ...]) -> Any:
        """Run block ``name`` with ``method`` (fetch, fetchrow, fetchval, execute) on the executor.

        A connection whose protocol state asyncpg reports as confused is terminated, not
        handed back to the pool for the next caller to meet the same error.
        """
        sql = self._q[name]
        try:
            if isinstance(self._ex, asyncpg.Pool):
                async with self._ex.acquire() as conn:
                    try:
                        return await getattr(conn, method)(sql, *args)
                    except asyncpg.InternalClientError:
                        conn.terminate()
                        raise
            return await getattr(self._ex, method)(sql, *args)
        except POSTGRES_ERRORS as exc:
            raise self._failed(name, exc) from exc

    async def _fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        result: list[asyncpg.Record] = await self._call("fetch", name, args)
        return result

    async def _fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        result: asyncpg.Record | None = await self._call("fetchrow", name, args)
        return result

    async def _fetchval(self, name: str, *args: Any) -> Any:
        return await self._call("fetchval", name, args)

    async def _copy(self, name: str, table: str, columns: Sequence[str], source: AsyncIterable[bytes]) -> None:
        """``COPY table (columns) FROM STDIN`` (text format, one statement) of the rows ``source`` yields.

        Each chunk ``source`` yields is sent as it comes, so PostgreSQL writes those rows while
        the caller prepares the next ones; the connection is busy until ``source`` ends.

        :param name: what a :class:`~taskmesh.errors.StoreError` names.
        :param source: chunks of whole rows in ``COPY``'s text format, as bytes.
        :raises StoreError: PostgreSQL refused the rows or failed; the statement wrote nothing.
        """
        assert not isinstance(self._ex, asyncpg.Pool), "a COPY runs in the caller's transaction"
        try:
            await self._ex.copy_to_table(table, source=source, columns=list(columns))
        except POSTGRES_ERRORS as exc:
            raise self._failed(name, exc) from exc

    async def _execute(self, name: str, *args: Any) -> str:
        result: str = await self._call("execute", name, args)
        return result
