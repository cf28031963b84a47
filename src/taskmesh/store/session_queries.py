"""Typed calls of the ``console_session_*`` blocks of ``queries.sql``: the console's sessions."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from taskmesh.store.sql import Queries


class SessionQueries(Queries):
    """Queries on ``console_sessions`` (migration 0015)."""

    async def insert(self, id_hash: bytes, key_id: str | None, csrf_token: str, ttl_seconds: float) -> datetime:
        """``console_session_insert``: a session of ``key_id`` (``None``: an open instance's visitor).

        :returns: when it expires (the database's clock).
        """
        expires: datetime = await self._fetchval("console_session_insert", id_hash, key_id, csrf_token, ttl_seconds)
        return expires

    async def lookup(self, id_hash: bytes) -> asyncpg.Record | None:
        """``console_session_lookup``: ``key_id``, ``csrf_token``, ``expires_at``; ``None``: none, or expired."""
        return await self._fetchrow("console_session_lookup", id_hash)

    async def delete(self, id_hash: bytes) -> None:
        """``console_session_delete``: sign-out."""
        await self._execute("console_session_delete", id_hash)

    async def delete_expired(self, limit: int) -> int:
        """``console_session_delete_expired``: how many expired sessions were deleted (at most ``limit``)."""
        status = await self._execute("console_session_delete_expired", limit)
        return int(status.split()[-1])
