"""The named SQL blocks of ``queries.sql`` and the base of the typed query classes.

Every call goes through :class:`Queries`, whose helpers turn any asyncpg or
socket failure into a :class:`~taskmesh.errors.StoreError` naming the block,
classified as transient or not (``store/classify.py``). Nothing outside
``taskmesh.store`` sees asyncpg's exceptions.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from taskmesh.store.classify import POSTGRES_ERRORS, postgres_error

Executor = asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy
"""What a query runs on: the pool (one statement, autocommit) or a connection (inside a transaction)."""

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def queries() -> dict[str, str]:
    """The named blocks of ``queries.sql``: ``{"task_insert_many": "WITH ...", ...}``."""
    text = resources.files("taskmesh.store").joinpath("queries.sql").read_text()
    parts = _NAME_LINE.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)}


class Queries:
    """Base of the per-entity query classes: runs named blocks on one executor.

    :param executor: the pool, or a connection whose transaction the caller owns.
    """

    def __init__(self, executor: Executor) -> None:
        self._ex = executor
        self._q = queries()

    async def _fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        try:
            return await self._ex.fetch(self._q[name], *args)
        except POSTGRES_ERRORS as exc:
            raise postgres_error(name, exc) from exc

    async def _fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        try:
            return await self._ex.fetchrow(self._q[name], *args)
        except POSTGRES_ERRORS as exc:
            raise postgres_error(name, exc) from exc

    async def _fetchval(self, name: str, *args: Any) -> Any:
        try:
            return await self._ex.fetchval(self._q[name], *args)
        except POSTGRES_ERRORS as exc:
            raise postgres_error(name, exc) from exc

    async def _execute(self, name: str, *args: Any) -> str:
        try:
            return await self._ex.execute(self._q[name], *args)
        except POSTGRES_ERRORS as exc:
            raise postgres_error(name, exc) from exc
