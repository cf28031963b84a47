"""Retention: finished tasks older than their state's retention are deleted, in small batches.

Every ``interval`` seconds (default 60) one instance (lock
``{prefix}:lock:retention``) deletes, per finished state, tasks unchanged for
longer than its retention (``retention_completed_days`` 7,
``retention_cancelled_days`` 7, ``retention_failed_days`` 90; 0 keeps them),
``batch`` rows per statement (default 1,000) and at most ``max_batches`` per
tick, so no statement holds locks for long however large the history. Runs
go with their task (``ON DELETE CASCADE``); the reconciler drops deleted ids
from the DLQ mirror. Logs ``tasks_deleted`` with counts per state.
"""

from __future__ import annotations

import anyio
import structlog

from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.store import redis as rstore
from taskmesh.tasks import Tasks

log = structlog.get_logger("taskmesh.retention")


async def run_once(
    tasks: Tasks, retention: dict[str, float], *, batch: int = 1000, max_batches: int = 50
) -> dict[str, int]:
    """Delete what is due; returns counts by state."""
    deleted: dict[str, int] = {}
    for status, seconds in retention.items():
        for _ in range(max_batches):
            n = await tasks.delete_finished(status, seconds, batch)
            deleted[status] = deleted.get(status, 0) + n
            if n < batch:
                break
    return {k: v for k, v in deleted.items() if v}


async def run(tasks: Tasks, retention: dict[str, float], *, interval: float = 60.0) -> None:
    """Tick forever (cancelled by the supervisor)."""
    outage = Outage("retention")
    while True:
        await anyio.sleep(interval)
        try:
            token = await rstore.try_lock(tasks.redis, tasks.keys.lock("retention"), int(interval * 1000))
            if token is None:
                continue
            deleted = await run_once(tasks, retention)
        except STORE_ERRORS as exc:
            await outage.failed(exc)
            continue
        outage.recovered()
        if deleted:
            log.info("tasks_deleted", **deleted)
