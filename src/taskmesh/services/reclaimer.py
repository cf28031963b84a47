"""Reclaimer: runs whose lease expired are ended, and their tasks retried or failed.

Every ``interval`` seconds (``reclaim_interval_seconds``, default 5) it ends, in
statements of up to ``batch`` rows, the running runs whose ``lease_expires_at``
passed: their instance died, froze, or no longer holds them (a live
instance's heartbeat extends exactly the runs it holds). The run ends with
``error = 'lease expired'`` and the task is retried (an attempt spent, backoff
``min(2^n, 3600)`` s with jitter), failed and dead-lettered when its retries
are spent (so a task that kills its worker every time ends in the DLQ), or
cancelled when that was requested. It also marks workers silent for
``3 * lease_seconds`` as ``lost`` and forgets stopped or lost ones after a day.

Safe in every instance at once: ``FOR UPDATE SKIP LOCKED`` hands each run to
one reclaimer, and the committer's fence drops the late result of a run that
was reclaimed. Emits ``runs_reclaimed`` and ``workers_lost`` (warning) and
``taskmesh_runs_reclaimed_total``. Tick counts: by the task's new status.
"""

from __future__ import annotations

from taskmesh.observability.logs import get_logger
from taskmesh.services.base import Counts, run_periodic
from taskmesh.tasks.tasks import Tasks

log = get_logger("taskmesh.reclaimer")

FORGET_WORKERS_AFTER_SECONDS = 24 * 3600


async def run_once(tasks: Tasks, *, lease_seconds: float, batch: int = 500) -> Counts:
    """One tick: returns counts of reclaimed runs by the task's new status (``queued``, ``failed``, ...).

    :raises StoreError: a store failed.
    """
    total: dict[str, int] = {}
    while True:
        rows = await tasks.pg.tasks.reclaim_expired(lease_seconds, batch)
        await tasks.mirror(rows)
        for row in rows:
            total[row["status"]] = total.get(row["status"], 0) + 1
            if tasks.metrics is not None:
                tasks.metrics.runs_reclaimed.labels(row["status"]).inc()
                tasks.metrics.run_finished(row["queue"], row["name"], "lease_expired", None)
        if len(rows) < batch:
            break
    lost = await tasks.pg.workers.mark_lost(3 * lease_seconds)
    await tasks.pg.workers.delete_old(FORGET_WORKERS_AFTER_SECONDS)
    if lost:
        log.warning("workers_lost", count=lost)
        if tasks.metrics is not None:
            tasks.metrics.workers_lost.inc(lost)
    if total:
        log.warning("runs_reclaimed", **total)
    return total


async def run(tasks: Tasks, *, lease_seconds: float, interval: float) -> None:
    """Tick for ever (cancelled by the supervisor)."""
    await run_periodic(
        "reclaimer", lambda: run_once(tasks, lease_seconds=lease_seconds), interval=interval, first_delay=interval
    )
