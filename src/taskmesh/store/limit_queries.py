"""Typed calls of ``limits.sql``: the limits set at run time."""

from __future__ import annotations

import asyncpg

from taskmesh.store.sql import Queries


class LimitQueries(Queries):
    """Queries on ``limits`` (each row overrides, or adds, the configured limit of its name)."""

    async def list(self) -> list[asyncpg.Record]:
        """``limit_list``: ``name, settings`` (JSON text), ``updated_at, updated_by`` of every row, by name."""
        return await self._fetch("limit_list")

    async def upsert(self, name: str, settings_json: str, updated_by: str | None) -> asyncpg.Record:
        """``limit_upsert``: set limit ``name`` to ``settings_json``; returns its row as :meth:`list` does.

        :raises StoreError: PostgreSQL failed; nothing was written.
        """
        row = await self._fetchrow("limit_upsert", name, settings_json, updated_by)
        assert row is not None  # an upsert returns its row
        return row

    async def delete(self, name: str) -> bool:
        """``limit_delete``: whether a row of ``name`` was there (and is gone)."""
        return await self._fetchval("limit_delete", name) is not None
