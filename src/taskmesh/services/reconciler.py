"""Reconciler: Redis is rebuilt from PostgreSQL, the source of truth (design.md principle 1).

Three jobs, each safe to run in every instance at once (``ZADD NX``; the DLQ
mirror is rewritten in one MULTI):

- **Resync after a flush or restart.** Every ``check_interval`` seconds it
  reads Redis's ``run_id`` and the marker key ``{prefix}:marker``. A new
  run_id (restart) or a missing marker (flush, or a restart without
  persistence) triggers a full resync at once: every queued task of the
  instance's queues whose id Redis lacks is pushed (ready when due, else
  delayed), and each queue's DLQ mirror is rewritten from the failed tasks;
  then the marker is written. One instance does it (lock
  ``{prefix}:lock:resync``); the others wait for the marker.
- **Periodic sweep.** Every ``sweep_interval`` seconds (default 5) it
  compares, per queue, the queued count in PostgreSQL with the ids in Redis;
  where Redis holds fewer, the queued tasks unchanged for that long, oldest
  first (up to ``limit``, through the partial index on queued tasks), are
  checked and the missing ones pushed: a create whose Redis push failed, an
  id popped whose claim failed. Every minute the check covers every queue
  whatever the counts say. Lock ``{prefix}:lock:reconciler`` keeps it to one
  instance per interval.
- **DLQ mirror repair**, with each sweep.

Emits ``redis_resynced`` and ``tasks_repushed`` logs and the
``taskmesh_redis_resyncs_total`` / ``taskmesh_tasks_repushed_total`` metrics.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import structlog

from taskmesh.models import PushTarget
from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.store import redis as rstore
from taskmesh.tasks import Tasks

log = structlog.get_logger("taskmesh.reconciler")

DLQ_MIRROR_MAX = 10_000
"""Most ids kept in one queue's DLQ mirror (listing and replay read Postgres)."""
RESYNC_PAGE = 1000
FULL_SWEEP_EVERY = 60.0
"""Seconds between sweeps that check every queue, drift or not (counts can hide a swap)."""


async def _push(tasks: Tasks, targets: Sequence[PushTarget]) -> int:
    pushed = await rstore.push_missing(tasks.redis, tasks.keys, targets)
    if tasks.metrics is not None:
        for queue, n in Counter(t.queue for t in pushed).items():
            tasks.metrics.tasks_repushed.labels(queue).inc(n)
    return len(pushed)


async def repair_dlq(tasks: Tasks, queues: Sequence[str]) -> int:
    """Rewrite each queue's DLQ mirror that differs from Postgres; returns queues repaired."""
    repaired = 0
    for queue in queues:
        ids = await tasks.failed_ids(queue, DLQ_MIRROR_MAX)
        if await rstore.rewrite_dlq(tasks.redis, tasks.keys, queue, ids):
            repaired += 1
    return repaired


async def drifted(tasks: Tasks, queues: Sequence[str]) -> list[str]:
    """Queues whose Redis sets hold fewer ids than Postgres has queued tasks.

    Two counts per queue (an index-only count in Postgres, ``ZCARD`` in Redis)
    instead of a membership check per task: a long backlog that Redis holds
    in full costs nothing to confirm.
    """
    counts = await tasks.queued_counts(queues)
    out = []
    for queue in queues:
        ready, delayed, _ = await rstore.depths(tasks.redis, tasks.keys, queue)
        if ready + delayed < counts.get(queue, 0):
            out.append(queue)
    return out


async def sweep(tasks: Tasks, queues: Sequence[str], *, min_age: float, limit: int = 5000, full: bool = True) -> int:
    """Push queued tasks unchanged for ``min_age`` seconds that Redis lacks; returns ids pushed.

    :param full: check every queue; otherwise only queues whose counts show drift.
    Skipped (returns 0) when another instance swept within ``min_age``.
    """
    token = await rstore.try_lock(tasks.redis, tasks.keys.lock("reconciler"), max(1000, int(min_age * 1000)))
    if token is None:
        return 0
    targets = list(queues) if full else await drifted(tasks, queues)
    pushed = await _push(tasks, await tasks.stale_queued(targets, min_age, limit)) if targets else 0
    await repair_dlq(tasks, queues)
    return pushed


async def resync(tasks: Tasks, queues: Sequence[str]) -> int:
    """Push every queued task Redis lacks and rewrite the DLQ mirrors; returns ids pushed."""
    pushed = 0
    after = uuid.UUID(int=0)
    while True:
        page = await tasks.queued_page(queues, after, RESYNC_PAGE)
        if not page:
            break
        pushed += await _push(tasks, page)
        after = page[-1].task_id
    await repair_dlq(tasks, queues)
    return pushed


@dataclass
class Watch:
    """What the reconciler last saw of Redis: its run_id once the marker was there."""

    run_id: str | None = None


async def check(tasks: Tasks, queues: Sequence[str], watch: Watch, *, instance: str) -> int | None:
    """Detect a Redis flush or restart and resync; returns ids pushed, or None when nothing happened."""
    run_id, marker = await rstore.identity(tasks.redis, tasks.keys)
    if marker and run_id == watch.run_id:
        return None
    lock = tasks.keys.lock("resync")
    token = await rstore.try_lock(tasks.redis, lock, 60_000)
    if token is None:
        return None  # another instance resyncs; the marker tells us when it is done
    try:
        # Someone may have finished a resync between our look and our lock.
        run_id, marker = await rstore.identity(tasks.redis, tasks.keys)
        if marker and watch.run_id is not None and run_id == watch.run_id:
            return None
        if marker and watch.run_id is None:
            watch.run_id = run_id  # first look at a healthy Redis: nothing was lost
            return None
        pushed = await resync(tasks, queues)
        await rstore.set_marker(tasks.redis, tasks.keys, instance)
        watch.run_id = run_id
        if tasks.metrics is not None:
            tasks.metrics.redis_resyncs.inc()
        # No marker: Redis lost its data, or this is the deployment's first start (nothing pushed).
        reason = "restart" if marker else ("data lost" if pushed else "no marker yet")
        if pushed:
            log.warning("redis_resynced", pushed=pushed, reason=reason)
        else:
            log.info("redis_resynced", pushed=pushed, reason=reason)
        return pushed
    finally:
        await rstore.release_lock(tasks.redis, lock, token)


async def run(
    tasks: Tasks,
    queues: Sequence[str],
    *,
    instance: str,
    sweep_interval: float = 5.0,
    check_interval: float = 1.0,
) -> None:
    """Watch and sweep forever (cancelled by the supervisor)."""
    outage = Outage("reconciler")
    watch = Watch()
    next_sweep = anyio.current_time() + sweep_interval
    next_full = anyio.current_time() + FULL_SWEEP_EVERY
    while True:
        try:
            await check(tasks, queues, watch, instance=instance)
            if anyio.current_time() >= next_sweep:
                next_sweep = anyio.current_time() + sweep_interval
                full = anyio.current_time() >= next_full
                if full:
                    next_full = anyio.current_time() + FULL_SWEEP_EVERY
                pushed = await sweep(tasks, queues, min_age=sweep_interval, full=full)
                if pushed:
                    log.info("tasks_repushed", count=pushed)
                # Recovery counts only once both stores answered (a sweep reads PostgreSQL).
                outage.recovered()
        except STORE_ERRORS as exc:
            await outage.failed(exc)
            continue
        await anyio.sleep(check_interval)
