"""Sampler: queue depths, the oldest ready task's age and workers by state, into gauges (issue 6).

Every ``interval`` seconds, not per scrape (a scrape must not cost a query per
queue, and ten Prometheus servers must not cost ten): ready and delayed sizes
from Redis (one pipeline), running and dead-lettered counts, the age of the
oldest runnable task per queue and workers by state from PostgreSQL (each
through a partial index, so the cost does not grow with the history). This
instance's in-flight runs per queue come from ``in_flight()``.

These are cluster-wide facts that every instance reports: aggregate them with
``max by (queue)``. A failing store is logged once per outage; the gauges keep
their last values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import structlog

from taskmesh.metrics import Metrics
from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.store.postgres import queries
from taskmesh.tasks import Tasks

log = structlog.get_logger("taskmesh.sampler")

WORKER_STATES = ("running", "draining", "stopped", "lost")


async def sample_once(
    tasks: Tasks, metrics: Metrics, queues: Sequence[str], in_flight: Callable[[], dict[str, int]] | None = None
) -> None:
    """Read every sampled value once and set the gauges.

    :raises OSError, asyncpg.PostgresError, redis.RedisError: a store failed (gauges partly updated).
    """
    q = queries()
    queues = list(queues)
    pipe = tasks.redis.pipeline(transaction=False)
    for queue in queues:
        pipe.zcard(tasks.keys.ready(queue))
        pipe.zcard(tasks.keys.delayed(queue))
    sizes = await pipe.execute()
    for i, queue in enumerate(queues):
        metrics.queue_depth.labels(queue, "ready").set(sizes[2 * i])
        metrics.queue_depth.labels(queue, "delayed").set(sizes[2 * i + 1])
    async with tasks.pool.acquire() as conn:
        running = {r["queue"]: r["n"] for r in await conn.fetch(q["sample_running_by_queue"], queues)}
        failed = {r["queue"]: r["n"] for r in await conn.fetch(q["sample_failed_by_queue"], queues)}
        ages = {queue: await conn.fetchval(q["sample_oldest_ready_age"], queue) for queue in queues}
        workers = {r["state"]: r["n"] for r in await conn.fetch(q["sample_workers_by_state"])}
    for queue in queues:
        metrics.queue_depth.labels(queue, "running").set(running.get(queue, 0))
        metrics.queue_depth.labels(queue, "dead_letter").set(failed.get(queue, 0))
        metrics.queue_oldest_ready_age.labels(queue).set(ages[queue])
    for state in {*WORKER_STATES, *workers}:
        metrics.workers.labels(state).set(workers.get(state, 0))
    if in_flight is not None:
        held = in_flight()
        for queue in queues:
            metrics.in_flight.labels(queue).set(held.get(queue, 0))


async def run(
    tasks: Tasks,
    metrics: Metrics,
    queues: Sequence[str],
    *,
    interval: float,
    in_flight: Callable[[], dict[str, int]] | None = None,
) -> None:
    """Sample every ``interval`` seconds forever (cancelled by the supervisor)."""
    outage = Outage("sampler")
    while True:
        try:
            await sample_once(tasks, metrics, queues, in_flight)
            outage.recovered()
        except STORE_ERRORS as exc:
            await outage.failed(exc)
            continue
        await anyio.sleep(interval)
