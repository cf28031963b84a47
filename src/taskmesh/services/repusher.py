"""Re-push: queued tasks that PostgreSQL has and Redis may lack are pushed again.

A create commits before its Redis push; when Redis was down at that moment,
or an id was popped and its claim failed, the task stays ``queued`` in
PostgreSQL with nothing in Redis. Every ``interval`` seconds this service
takes up to ``limit`` queued tasks of the instance's queues that have not
changed for ``interval`` seconds, oldest first, and pushes those whose id is
in neither the ready nor the delayed set (ready when due, else delayed;
``ZADD NX``, so a race never duplicates and a stray id only costs a failed
claim). This is the simple form the core issue
asks for; the full reconciler (Redis restart detection, DLQ mirror repair)
replaces it later.

Guarded by the singleton lock ``{prefix}:lock:repusher``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import anyio
import structlog

from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.store import redis as rstore
from taskmesh.tasks import Tasks

log = structlog.get_logger("taskmesh.repusher")


async def run_once(tasks: Tasks, queues: Sequence[str], *, min_age: float, limit: int = 1000) -> int:
    """One sweep: returns tasks pushed (0 when another instance holds the lock)."""
    lock_key = tasks.keys.lock("repusher")
    token = await rstore.try_lock(tasks.redis, lock_key, max(1000, int(min_age * 1000)))
    if token is None:
        return 0
    targets = await tasks.stale_queued(queues, min_age, limit)
    if not targets:
        return 0
    pushed = await rstore.push_missing(tasks.redis, tasks.keys, targets)
    if tasks.metrics is not None:
        for queue, n in Counter(t.queue for t in pushed).items():
            tasks.metrics.tasks_repushed.labels(queue).inc(n)
    return len(pushed)


async def run(tasks: Tasks, queues: Sequence[str], *, interval: float = 5.0) -> None:
    """Sweep forever (cancelled by the supervisor)."""
    outage = Outage("repusher")
    while True:
        await anyio.sleep(interval)
        try:
            n = await run_once(tasks, queues, min_age=interval)
        except STORE_ERRORS as exc:
            await outage.failed(exc)
            continue
        outage.recovered()
        if n:
            log.info("tasks_repushed", count=n)
