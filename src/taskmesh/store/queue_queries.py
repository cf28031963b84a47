"""Typed calls of the ``queue_*`` blocks of ``queries.sql``: pausing and resuming queues."""

from __future__ import annotations

import asyncpg

from taskmesh.store.sql import Queries


class QueueQueries(Queries):
    """Queries on ``queues`` (a row per queue an operator paused at least once)."""

    async def pause(self, queue: str, reason: str | None) -> asyncpg.Record:
        """``queue_pause``: ``name, paused_at, paused_reason`` after the pause.

        A paused queue keeps its ``paused_at``; ``reason`` ``None`` keeps the last one.
        """
        row = await self._fetchrow("queue_pause", queue, reason)
        assert row is not None  # an upsert always returns its row
        return row

    async def resume(self, queue: str) -> None:
        """``queue_resume``: a queue never paused has no row, and nothing changes."""
        await self._execute("queue_resume", queue)

    async def get_pause(self, queue: str) -> asyncpg.Record | None:
        """``queue_get_pause``: the queue's row, ``None`` when it was never paused."""
        return await self._fetchrow("queue_get_pause", queue)

    async def list_paused(self, limit: int) -> list[asyncpg.Record]:
        """``queue_list_paused``: paused queues by name, at most ``limit``."""
        return await self._fetch("queue_list_paused", limit)
