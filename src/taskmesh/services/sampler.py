"""Sampler: queue depths, the oldest ready task's age, workers by state and what each limit holds, into gauges.

Every ``interval`` seconds (``metrics_sample_seconds``, 5), not per scrape (a
scrape must not cost a query per queue, and ten Prometheus servers must not
cost ten): ready and delayed sizes from Redis (one pipeline), running and
dead-lettered counts, the age of the oldest runnable task per queue, whether
each queue is paused, and workers by state from PostgreSQL (each through a partial index, so the cost
does not grow with the history). This instance's in-flight runs per queue come
from ``in_flight()``. The queues are the instance's own (``queue_names``), which
are always labels of their own.

It also reads which queues live workers serve: they become labels of their
own (:meth:`Metrics.set_served_queues`, at most 1,000), and the due queued
tasks of every other queue are summed into
``taskmesh_queue_depth{queue="(unserved)", state="ready"}``, so a task sent to
a queue no instance works (a typo: ``defualt``) shows without one series per
typo.

Each sample first adds this instance's ended runs and its started runs' waits
(:class:`RunTally`) to the current minute's rows of ``queue_minutes``, and then raises
that minute's most ready tasks and oldest ready age of its queues to what it saw (the
console's charts).

Workflows that ended since the last sample are taken from ``workflow_ended`` (each row by one
instance) and counted by name and outcome, with their durations.

These are cluster-wide facts that every instance reports: aggregate them with
``max by (queue)``. A failing store is handled by the periodic loop
(``services.base``); the gauges keep their last values. Tick counts: none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from taskmesh.limits.book import LimitBook
from taskmesh.observability.metrics import UNSERVED_QUEUE, Metrics
from taskmesh.services.base import Counts, run_periodic
from taskmesh.services.run_tally import RunTally
from taskmesh.store import Stores
from taskmesh.store.task_queries import DEAD_LETTER_FOLD_ROUNDS
from taskmesh.tasks.states import WorkerState

ENDED_WORKFLOWS_READ = 10_000
"""Most ended workflows one sample counts (the rest wait for the next)."""
QUEUES_READ = 10_000
"""Most served queues one sample reads, and most unserved queues whose tasks it counts (each an index probe)."""


async def run_once(
    stores: Stores,
    metrics: Metrics,
    queues: Sequence[str],
    in_flight: Callable[[], dict[str, int]] | None = None,
    tally: RunTally | None = None,
    limits: LimitBook | None = None,
) -> Counts:
    """Add this instance's ended runs to ``queue_minutes``, then read every sampled value once and set the gauges.

    :param tally: this instance's ended runs since the last sample (put back when PostgreSQL fails).
    :param limits: the limits in force: each one's slots held and tasks waiting, over ``queues``.
    :raises StoreError: a store failed (gauges partly updated).
    """
    if tally is not None:
        await _add_minute(stores, tally)
    await count_ended_workflows(stores, metrics)
    queues = list(queues)
    sizes = await stores.redis.sizes(queues)
    for queue, (ready, delayed) in sizes.items():
        metrics.queue_depth.labels(queue, "ready").set(ready)
        metrics.queue_depth.labels(queue, "delayed").set(delayed)
    running = await stores.pg.tasks.sample_running_by_queue(queues)
    # keeps the deltas each read adds up few, however many tasks failed since the last tick
    await stores.pg.tasks.compact_dead_letter_counts(rounds=DEAD_LETTER_FOLD_ROUNDS)
    failed = await stores.pg.tasks.sample_failed_by_queue(queues)
    ages = {queue: await stores.pg.tasks.sample_oldest_ready_age(queue) for queue in queues}
    workers = await stores.pg.workers.sample_by_state()
    paused = {r["name"] for r in await stores.pg.queues.list_paused(QUEUES_READ)}
    served = await stores.pg.workers.served_queues(QUEUES_READ)
    metrics.set_served_queues(served)  # the first SERVED_QUEUES_MAX become labels
    unserved = await stores.pg.tasks.count_queued_unserved(served, QUEUES_READ)
    metrics.queue_depth.labels(UNSERVED_QUEUE, "ready").set(sum(r["ready"] for r in unserved))
    if queues:
        await stores.pg.queues.sample_minute({q: (sizes.get(q, (0, 0))[0], ages[q]) for q in queues})
    for queue in queues:
        metrics.queue_depth.labels(queue, "running").set(running.get(queue, 0))
        metrics.queue_depth.labels(queue, "dead_letter").set(failed.get(queue, 0))
        metrics.queue_oldest_ready_age.labels(queue).set(ages[queue])
        metrics.queue_paused.labels(queue).set(1 if queue in paused else 0)
    for state in {*WorkerState, *workers}:
        metrics.workers.labels(str(state)).set(workers.get(state, 0))
    if limits is not None and limits.limits:
        await sample_limits(stores, metrics, queues, limits)
    if in_flight is not None:
        held = in_flight()
        for queue in queues:
            metrics.in_flight.labels(queue).set(held.get(queue, 0))
    return {}


async def sample_limits(stores: Stores, metrics: Metrics, queues: Sequence[str], limits: LimitBook) -> None:
    """Set ``taskmesh_limit_in_use`` and ``taskmesh_limit_waiting`` of every limit in force (0 when idle); a
    name no limit has any more is not a label (bounded by the limits in force)."""
    totals = dict.fromkeys(limits.limits, (0, 0))
    for queue in queues:
        for name, (in_use, waiting) in (await stores.redis.limits.gauges(queue)).items():
            if name in totals:
                totals[name] = (totals[name][0] + in_use, totals[name][1] + waiting)
    for name, (in_use, waiting) in totals.items():
        metrics.limit_in_use.labels(name).set(in_use)
        metrics.limit_waiting.labels(name).set(waiting)


async def _add_minute(stores: Stores, tally: RunTally) -> None:
    counts, waits = tally.take(), tally.take_waits()
    if not counts and not waits:
        return
    try:
        await stores.pg.queues.add_minute(counts, waits)
    except BaseException:
        tally.put_back(counts)
        tally.put_back_waits(waits)
        raise


async def run(
    stores: Stores,
    metrics: Metrics,
    queues: Sequence[str],
    *,
    interval: float,
    in_flight: Callable[[], dict[str, int]] | None = None,
    tally: RunTally | None = None,
    limits: LimitBook | None = None,
) -> None:
    """Sample every ``interval`` seconds for ever (cancelled by the supervisor)."""
    await run_periodic(
        "sampler", lambda: run_once(stores, metrics, queues, in_flight, tally, limits), interval=interval
    )


async def count_ended_workflows(stores: Stores, metrics: Metrics) -> int:
    """Count the workflows that ended since any instance last looked (each by exactly one instance).

    :returns: how many were counted.
    :raises StoreError: PostgreSQL failed (nothing was taken).
    """
    rows = await stores.pg.workflows.take_ended(ENDED_WORKFLOWS_READ)
    for row in rows:
        name = metrics.workflow_label(row["name"])
        metrics.workflows_ended.labels(name, row["outcome"]).inc()
        metrics.workflow_duration.labels(name).observe(row["seconds"])
    return len(rows)
