"""Typed calls of the ``bulk_*`` and ``operation_*`` blocks of ``queries.sql``: bulk operations
(retry and replay use ``TaskQueries.requeue``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import asyncpg

from taskmesh.store.sql import Queries


class OperationQueries(Queries):
    """Queries on ``operations``, and the tasks' side of each bulk action on a batch of ids."""

    async def cancel(self, ids: Sequence[uuid.UUID]) -> list[asyncpg.Record]:
        """``bulk_cancel``: the transition rows (``id, queue, priority, status, run_at``): ``cancelled``, or
        ``running`` for a running task asked to stop."""
        return await self._fetch("bulk_cancel", list(ids))

    async def delete(self, ids: Sequence[uuid.UUID]) -> list[asyncpg.Record]:
        """``bulk_delete``: ``id, queue, status`` of the finished tasks deleted."""
        return await self._fetch("bulk_delete", list(ids))

    async def insert(
        self,
        op_id: uuid.UUID,
        action: str,
        filter_json: str,
        reason: str | None,
        tenant_id: str | None = None,
        queues: Sequence[str] | None = None,
    ) -> asyncpg.Record:
        """``operation_insert``: the new operation's row, bound to the starting key's tenant and queues."""
        row = await self._fetchrow(
            "operation_insert", op_id, action, filter_json, reason, tenant_id, None if queues is None else list(queues)
        )
        assert row is not None  # an insert returns its row
        return row

    async def get(self, op_id: uuid.UUID) -> asyncpg.Record | None:
        """``operation_get``."""
        return await self._fetchrow("operation_get", op_id)

    async def take(self, owner: str, lease_seconds: float) -> asyncpg.Record | None:
        """``operation_take``: the oldest running operation nobody holds, now leased to ``owner``."""
        return await self._fetchrow("operation_take", owner, lease_seconds)

    async def advance(
        self,
        op_id: uuid.UUID,
        owner: str,
        cursor: tuple[datetime, uuid.UUID],
        done: int,
        skipped: int,
        lease_seconds: float,
    ) -> bool:
        """``operation_advance``: whether ``owner`` still held the lease (else nothing changed)."""
        row = await self._fetchrow(
            "operation_advance", op_id, owner, cursor[0], cursor[1], done, skipped, lease_seconds
        )
        return row is not None

    async def finish(self, op_id: uuid.UUID, owner: str, status: str, error: str | None) -> asyncpg.Record | None:
        """``operation_finish``: the ended row, ``None`` when ``owner`` had lost the lease."""
        return await self._fetchrow("operation_finish", op_id, owner, status, error)
