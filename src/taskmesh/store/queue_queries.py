"""Typed calls of the ``queue_*`` blocks of ``queries.sql``: pausing queues, their depths, their runs per minute."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg

from taskmesh.store.sql import Queries

MINUTE_COLUMNS = ("succeeded", "retried", "failed", "cancelled", "interrupted")
"""The counters of ``queue_minutes``: runs that ended so, by the executor's outcome."""


EVERY_QUEUE = "*"
"""The ``queue_minutes`` rows of every queue's runs and waits together (``*`` is no queue's name)."""


class QueueQueries(Queries):
    """Queries on ``queues`` (a row per queue an operator paused at least once), on the
    per-minute counts of ended runs (``queue_minutes``), and on queue depths."""

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

    async def list_known(self) -> list[str]:
        """``queue_list_known``: queues with queued, running or dead-lettered tasks, or paused; at most 1,000."""
        return [r["queue"] for r in await self._fetch("queue_list_known")]

    async def depths(self, queues: Sequence[str]) -> list[asyncpg.Record]:
        """``queue_depths``: ``queue, retrying, running, dead_letter, oldest_ready_age_seconds`` per queue."""
        return await self._fetch("queue_depths", list(queues))

    async def add_minute(
        self, counts: Mapping[str, Mapping[str, int]], waits: Mapping[str, Sequence[int]] | None = None
    ) -> None:
        """``queue_minutes_add``: add ``{queue: {column: runs}}`` and the wait histograms to the current minute's rows,
        and their sums to the row of :data:`EVERY_QUEUE`.

        :param counts: by queue, runs per :data:`MINUTE_COLUMNS` name (missing ones are 0).
        :param waits: by queue, started runs per wait bucket (``run_tally.WAIT_BOUNDS_SECONDS``).
        """
        waits = dict(waits or {})
        queues = list(dict.fromkeys([*counts, *waits]))
        if not queues:
            return
        rows = {q: dict(counts.get(q, {})) for q in queues}
        rows[EVERY_QUEUE] = {c: sum(r.get(c, 0) for r in rows.values()) for c in MINUTE_COLUMNS}
        if waits:
            width = max(len(w) for w in waits.values())
            waits[EVERY_QUEUE] = [sum(w[i] if i < len(w) else 0 for w in waits.values()) for i in range(width)]
        queues.append(EVERY_QUEUE)
        columns = [[rows[q].get(c, 0) for q in queues] for c in MINUTE_COLUMNS]
        histograms = ["{" + ",".join(str(n) for n in waits.get(q, ())) + "}" for q in queues]
        await self._execute("queue_minutes_add", queues, *columns, histograms)

    async def sample_minute(self, seen: Mapping[str, tuple[int, float]]) -> None:
        """``queue_minutes_sample``: raise the current minute's most ready tasks and oldest ready age.

        :param seen: by queue, ``(ready tasks, oldest ready task's age in seconds)`` as sampled now.
        """
        queues = list(seen)
        await self._execute(
            "queue_minutes_sample", queues, [seen[q][0] for q in queues], [float(seen[q][1]) for q in queues]
        )

    async def history(self, window_seconds: int, step_seconds: int, queue: str | None) -> list[asyncpg.Record]:
        """``queue_minutes_history``: the last ``window_seconds`` in steps of ``step_seconds`` (oldest first),
        of ``queue`` or of every queue summed (``None``)."""
        return await self._fetch("queue_minutes_history", window_seconds, step_seconds, queue)

    async def minutes_size(self) -> asyncpg.Record:
        """``queue_minutes_size``: the rollup's ``bytes``, estimated ``rows`` and oldest ``since``."""
        row = await self._fetchrow("queue_minutes_size")
        assert row is not None
        return row

    async def recent_minutes(self, queues: Sequence[str]) -> list[asyncpg.Record]:
        """``queue_minutes_recent``: the last full minute's and the current minute's rows of ``queues``."""
        return await self._fetch("queue_minutes_recent", list(queues))

    async def delete_old_minutes(self, older_than_seconds: float, limit: int) -> int:
        """``queue_minutes_delete_old``: how many rows were deleted."""
        status = await self._execute("queue_minutes_delete_old", older_than_seconds, limit)
        return int(status.rsplit(" ", 1)[1])
