"""Retention: finished tasks older than their state's retention are deleted, in small batches.

Every ``interval`` seconds (default 60) one instance (lock
``{prefix}:lock:retention``, held for the interval: it throttles the
deployment to one pass per interval, it does not guard correctness) deletes,
per finished state, tasks unchanged for longer than its retention
(``retention_completed_days`` 7, ``retention_cancelled_days`` 7,
``retention_failed_days`` 90; 0 keeps them), and ``queue_minutes`` rows older than
``retention_stats_days`` (30), ``batch`` rows per statement
(default 1,000) and at most ``max_batches`` per tick, so no statement holds
locks for long however large the history. Runs go with their task (``ON
DELETE CASCADE``); the reconciler drops deleted ids from the DLQ mirror.
Logs ``tasks_deleted`` with counts per state.
"""

from __future__ import annotations

from taskmesh.security import audit
from taskmesh.services.base import Counts, run_periodic
from taskmesh.store import PgStore, RedisStore

AUDIT_MONTHS_AHEAD = 2
"""Months of audit partitions made ahead of the current one."""


async def run_once(
    pg: PgStore,
    retention: dict[str, float],
    *,
    stats_seconds: float = 0,
    batch: int = 1000,
    max_batches: int = 50,
    audit_keep_days: float | None = None,
) -> Counts:
    """Delete what is due; returns counts by state (and ``queue_minutes`` rows, audit partitions,
    expired ``console_sessions``).

    :param retention: seconds after which a task in each finished state is deleted; under
        ``workflows``, after which a workflow that is over leaves with its tasks (which the
        others never delete).
    :param stats_seconds: seconds after which a ``queue_minutes`` row is deleted (0: kept).
    :param audit_keep_days: make the audit log's months ahead and drop those past this many days
        (0: drop none; ``None``: leave the audit log alone).
    :raises StoreError: PostgreSQL failed.
    """
    deleted: dict[str, int] = {}
    if audit_keep_days is not None:
        changed = await pg.audit.partitions(audit_keep_days, AUDIT_MONTHS_AHEAD)
        dropped = [name[1:] for name in changed if name.startswith("-")]
        if dropped:
            deleted["audit_partitions"] = len(dropped)
            event = audit.AuditEvent("audit.drop_partitions", actor_type="system", details={"dropped": dropped})
            await audit.write(pg, event)
            audit.emit(event)
    for status, seconds in retention.items():
        for _ in range(max_batches):
            if status == "workflows":  # a workflow over for long enough leaves with its tasks
                n = await pg.workflows.delete_finished(seconds, batch)
            else:
                n = await pg.tasks.delete_finished(status, seconds, batch)
            deleted[status] = deleted.get(status, 0) + n
            if n < batch:
                break
    if stats_seconds:
        for _ in range(max_batches):
            n = await pg.queues.delete_old_minutes(stats_seconds, batch)
            deleted["queue_minutes"] = deleted.get("queue_minutes", 0) + n
            if n < batch:
                break
    for _ in range(max_batches):
        n = await pg.sessions.delete_expired(batch)  # an ended session is useless: none is kept
        deleted["console_sessions"] = deleted.get("console_sessions", 0) + n
        if n < batch:
            break
    return {k: v for k, v in deleted.items() if v}


async def tick(
    pg: PgStore,
    redis: RedisStore,
    retention: dict[str, float],
    interval: float,
    stats_seconds: float = 0,
    audit_keep_days: float | None = None,
) -> Counts:
    """One pass when this instance takes the lock (else nothing)."""
    token = await redis.limits.try_lock(redis.keys.lock("retention"), int(interval * 1000))
    if token is None:
        return {}
    return await run_once(pg, retention, stats_seconds=stats_seconds, audit_keep_days=audit_keep_days)


async def run(
    pg: PgStore,
    redis: RedisStore,
    retention: dict[str, float],
    *,
    interval: float = 60.0,
    stats_seconds: float = 0,
    audit_keep_days: float | None = None,
) -> None:
    """Tick for ever (cancelled by the supervisor)."""
    await run_periodic(
        "retention",
        lambda: tick(pg, redis, retention, interval, stats_seconds, audit_keep_days),
        interval=interval,
        first_delay=interval,
        event="tasks_deleted",
    )
