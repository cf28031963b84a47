"""The queues' history for charts: the per-minute rollup ``queue_minutes`` over an hour or a day.

Each instance's sampler adds its ended runs, its started runs' waits (a histogram) and the
most ready tasks and oldest ready age it saw to the current minute's rows, so the history
is every instance's and survives restarts; ``retention_stats_days`` bounds it. This module
reads it back in steps (a minute over the last hour, five minutes over the last day), with
the steps nobody wrote filled in, and a p95 of the wait read off the summed histogram.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from taskmesh.services.run_tally import WAIT_BOUNDS_SECONDS
from taskmesh.store import PgStore
from taskmesh.tasks.records import iso

WINDOWS: dict[str, tuple[int, int]] = {"hour": (3600, 60), "day": (86400, 300)}
"""Each window's span and step, seconds."""


def wait_quantile(counts: Sequence[int], q: float = 0.95) -> float | None:
    """The ``q`` quantile of a wait histogram, as its bucket's upper bound in seconds.

    :param counts: started runs per bucket of :data:`~taskmesh.services.run_tally.WAIT_BOUNDS_SECONDS`
        (one more for longer waits).
    :returns: ``None`` when no run started, or when the quantile lies beyond the last bound (over an hour).
    """
    total = sum(counts)
    if total == 0:
        return None
    wanted, seen = q * total, 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= wanted:
            return WAIT_BOUNDS_SECONDS[i] if i < len(WAIT_BOUNDS_SECONDS) else None
    return None


async def history(pg: PgStore, window: str, queue: str | None, now: datetime | None = None) -> dict[str, Any]:
    """``{"window", "queue", "step_seconds", "points": [...], "rollup": {...}}``, oldest point first.

    Each point: ``{"at", "succeeded", "retried", "failed", "cancelled", "interrupted", "started",
    "wait_p95_seconds", "ready_max", "oldest_ready_max_seconds"}``; a step without a row has zero
    runs and ``None`` for the sampled values. ``rollup``: the table's ``bytes``, estimated ``rows``,
    its oldest minute ``since``.

    :param window: a key of :data:`WINDOWS`.
    :raises KeyError: an unknown ``window`` (the route checks it first).
    :raises StoreError: PostgreSQL failed.
    """
    span, step = WINDOWS[window]
    rows = {r["step"]: r for r in await pg.queues.history(span, step, queue)}
    now = now or datetime.now(UTC)
    last = datetime.fromtimestamp(int(now.timestamp()) // step * step, UTC)
    points = []
    for k in range(span // step - 1, -1, -1):
        at = last - timedelta(seconds=k * step)
        row = rows.get(at)
        waits = [n or 0 for n in row["wait_counts"]] if row is not None else []  # a sum over no rows is NULL
        points.append(
            {
                "at": iso(at),
                **{c: (row[c] if row is not None else 0) for c in ("succeeded", "retried", "failed", "cancelled")},
                "interrupted": row["interrupted"] if row is not None else 0,
                "started": sum(waits),
                "wait_p95_seconds": wait_quantile(waits),
                "ready_max": row["ready_max"] if row is not None else None,
                "oldest_ready_max_seconds": row["oldest_ready_max_seconds"] if row is not None else None,
            }
        )
    size = await pg.queues.minutes_size()
    rollup = {"bytes": size["bytes"], "rows": size["rows"], "since": iso(size["since"])}
    return {"window": window, "queue": queue, "step_seconds": step, "points": points, "rollup": rollup}
