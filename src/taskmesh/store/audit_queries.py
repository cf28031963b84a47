"""Typed calls of the ``audit_*`` blocks of ``queries.sql``: the audit log (migration 0014)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from taskmesh.store.sql import Queries


class AuditQueries(Queries):
    """Queries on ``audit_events``."""

    async def insert(self, *values: Any) -> asyncpg.Record:
        """``audit_insert`` (the columns in its order): ``id, at`` of the new event."""
        row = await self._fetchrow("audit_insert", *values)
        assert row is not None  # an INSERT ... RETURNING returns its row
        return row

    async def page(
        self,
        before: tuple[datetime, int],
        filters: tuple[str | None, str | None, str | None, str | None, str | None, str | None],
        since: datetime | None,
        limit: int,
    ) -> list[asyncpg.Record]:
        """``audit_page``: up to ``limit`` events before ``before``, newest first.

        :param filters: ``(tenant_id, actor_id, action, outcome, resource_type, resource_id)``, ``None``: any.
        """
        return await self._fetch("audit_page", before[0], before[1], *filters, since, limit)

    async def partitions(self, keep_days: float, months_ahead: int) -> list[str]:
        """``audit_partitions``: the partitions made (``+name``) and dropped (``-name``)."""
        return list(await self._fetchval("audit_partitions", keep_days, months_ahead) or [])
