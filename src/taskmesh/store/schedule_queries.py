"""Typed calls of the ``schedule_*`` blocks of ``queries.sql``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from taskmesh.store.sql import Queries


class ScheduleQueries(Queries):
    """Queries on ``schedules``."""

    async def upsert(self, *values: Any) -> bool:
        """``schedule_upsert`` (the columns in its order): whether the row was created or changed."""
        return await self._fetchrow("schedule_upsert", *values) is not None

    async def set_queue(self, name: str, queue: str) -> None:
        """``schedule_set_queue``: the row's effective queue (nothing is written when it is right)."""
        await self._execute("schedule_set_queue", name, queue)

    async def touch(self, names: Sequence[str], at: datetime) -> None:
        """``schedule_touch``: mark declarations as seen at ``at``."""
        await self._execute("schedule_touch", list(names), at)

    async def lock_due(self, names: Sequence[str], now: datetime) -> list[asyncpg.Record]:
        """``schedule_lock_due`` (inside a transaction): due rows, locked, others' locked rows skipped."""
        return await self._fetch("schedule_lock_due", list(names), now)

    async def due(self, names: Sequence[str], now: datetime) -> list[asyncpg.Record]:
        """``schedule_due``: the rows ``lock_due`` would lock, read without a lock."""
        return await self._fetch("schedule_due", list(names), now)

    async def advance(
        self, name: str, last_fire: datetime | None, next_fire: datetime | None, last_task: uuid.UUID | None
    ) -> None:
        """``schedule_advance``."""
        await self._execute("schedule_advance", name, last_fire, next_fire, last_task)

    async def next_due(self, names: Sequence[str]) -> datetime | None:
        """``schedule_next_due``: the earliest next fire of the active ones."""
        value: datetime | None = await self._fetchval("schedule_next_due", list(names))
        return value

    async def list(self) -> list[asyncpg.Record]:
        """``schedule_list``: every row by name."""
        return await self._fetch("schedule_list")

    async def get(self, name: str) -> asyncpg.Record | None:
        """``schedule_get``."""
        return await self._fetchrow("schedule_get", name)

    async def get_for_update(self, name: str) -> asyncpg.Record | None:
        """``schedule_get_for_update`` (inside a transaction)."""
        return await self._fetchrow("schedule_get_for_update", name)

    async def set_paused(self, name: str, paused: bool, next_fire: datetime | None) -> asyncpg.Record | None:
        """``schedule_set_paused``: the updated row."""
        return await self._fetchrow("schedule_set_paused", name, paused, next_fire)

    async def set_last_task(self, name: str, task_id: uuid.UUID) -> None:
        """``schedule_set_last_task``."""
        await self._execute("schedule_set_last_task", name, task_id)
