"""Reclaimer: runs whose lease expired are ended, and their tasks retried or failed.

Every ``interval`` seconds it ends, in one statement of up to ``batch`` rows,
the running runs whose ``lease_expires_at`` passed and whose worker has not
beaten for ``lease_seconds`` (a dead or frozen instance): the run ends with
``error = 'lease expired'`` and the task is retried (an attempt spent,
backoff ``min(2^n, 3600)`` s), failed and dead-lettered when its retries are
spent (so a task that kills its worker every time ends in the DLQ), or
cancelled when that was requested. It also marks workers silent for
``3 * lease_seconds`` as ``lost`` and forgets stopped or lost ones after a day.

Safe in every instance at once: ``FOR UPDATE SKIP LOCKED`` hands each run to
one reclaimer, and the committer's fence drops the late result of a run that
was reclaimed. Emits ``runs_reclaimed`` logs and ``taskmesh_runs_reclaimed_total``.
"""

from __future__ import annotations

import anyio
import structlog

from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.tasks import Tasks

log = structlog.get_logger("taskmesh.reclaimer")

FORGET_WORKERS_AFTER_SECONDS = 24 * 3600


async def run_once(tasks: Tasks, *, lease_seconds: float, batch: int = 500) -> dict[str, int]:
    """One tick: returns counts of reclaimed runs by the task's new status."""
    total: dict[str, int] = {}
    while True:
        counts = await tasks.reclaim_expired(lease_seconds, batch)
        for status, n in counts.items():
            total[status] = total.get(status, 0) + n
            if tasks.metrics is not None:
                tasks.metrics.runs_reclaimed.labels(status).inc(n)
        if sum(counts.values()) < batch:
            break
    lost = await tasks.mark_lost_workers(3 * lease_seconds, FORGET_WORKERS_AFTER_SECONDS)
    if lost:
        log.warning("workers_lost", count=lost)
        if tasks.metrics is not None:
            tasks.metrics.workers_lost.inc(lost)
    if total:
        log.warning("runs_reclaimed", **total)
    return total


async def run(tasks: Tasks, *, lease_seconds: float, interval: float) -> None:
    """Tick forever (cancelled by the supervisor)."""
    outage = Outage("reclaimer")
    while True:
        await anyio.sleep(interval)
        try:
            await run_once(tasks, lease_seconds=lease_seconds)
        except STORE_ERRORS as exc:
            await outage.failed(exc)
            continue
        outage.recovered()
