"""Typed calls of the ``worker_*`` blocks of ``queries.sql``: registration, heartbeats, the listing."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import asyncpg

from taskmesh.store.sql import Queries


class WorkerQueries(Queries):
    """Queries on ``workers`` (and the leases a heartbeat extends)."""

    async def heartbeat(
        self,
        worker_id: str,
        host: str,
        pid: int,
        queues_json: str,
        version: str,
        state: str,
        lease_seconds: float,
        held_run_ids: Sequence[uuid.UUID],
        handlers: Sequence[str] | None = None,
        handler_options: str | None = None,
    ) -> list[uuid.UUID]:
        """``worker_heartbeat``: upsert the row, extend the held runs' leases.

        :param handlers: the task names this instance has handlers for; ``None``: any name.
        :param handler_options: what it advertises of its registered handlers (JSON, ``advertised.py``).
        :returns: ids of held runs' tasks whose cancellation was requested.
        """
        rows = await self._fetch(
            "worker_heartbeat",
            worker_id,
            host,
            pid,
            queues_json,
            version,
            state,
            lease_seconds,
            list(held_run_ids),
            None if handlers is None else list(handlers),
            handler_options,
        )
        return [r["id"] for r in rows]

    async def deregister(self, worker_id: str) -> None:
        """``worker_deregister``: mark the row stopped."""
        await self._execute("worker_deregister", worker_id)

    async def mark_lost(self, silent_seconds: float) -> int:
        """``worker_mark_lost``: how many became lost."""
        return len(await self._fetch("worker_mark_lost", silent_seconds))

    async def delete_old(self, forget_after_seconds: float) -> None:
        """``worker_delete_old``."""
        await self._execute("worker_delete_old", forget_after_seconds)

    async def list(self, limit: int) -> list[asyncpg.Record]:
        """``worker_list``: live first, with their in-flight run counts."""
        return await self._fetch("worker_list", limit)

    async def sample_by_state(self) -> dict[str, int]:
        """``worker_sample_by_state``: rows per state."""
        return {r["state"]: r["n"] for r in await self._fetch("worker_sample_by_state")}

    async def served_handlers(self, limit: int) -> dict[str, frozenset[str] | None]:
        """``worker_list_served_handlers``: per served queue, the task names its live instances can run.

        :returns: ``{queue: names}``; ``None`` for a queue one of whose instances runs any name.
        """
        rows = await self._fetch("worker_list_served_handlers", limit)
        return {r["queue"]: None if r["any_name"] else frozenset(r["names"]) for r in rows}

    async def advertised_handlers(self, fresh_seconds: float, limit: int) -> Sequence[asyncpg.Record]:
        """``worker_list_advertised_handlers``: ``name, options`` (JSON text), ``worker_id`` per advertised
        name, plus a row with ``name`` NULL when a live instance runs any name."""
        return await self._fetch("worker_list_advertised_handlers", fresh_seconds, limit)

    async def served_queues(self, limit: int) -> Sequence[str]:
        """``worker_list_served_queues``: the queues live (running or draining) instances work, at most ``limit``."""
        return [r["queue"] for r in await self._fetch("worker_list_served_queues", limit)]
