"""The instance's service table: every service it runs, when it starts and in which phase it stops.

| service | critical | starts | stop phase | when |
| --- | --- | --- | --- | --- |
| worker_process:k | yes | HTTP bound | intake | ``worker_processes`` above 1 (k = 1 to N - 1) |
| committer | yes | stores answered | results | always |
| heartbeat | yes | stores answered | upkeep | workers enabled |
| clock_sync | no | stores answered | upkeep | always |
| delayed_mover, reclaimer, reconciler | yes | stores answered | upkeep | always |
| retention | no | stores answered | upkeep | always (it also makes the audit log's months ahead) |
| sampler, operations | no | stores answered | upkeep | always |
| enqueued_listener | no | stores answered | upkeep | ``LISTEN`` is reachable (not behind a transaction pooler alone) |
| finished_feed, denial_summaries | no | stores answered | upkeep | the API is served |
| scheduler | no | stores answered | fires | ``scheduler_enabled`` and schedules configured |
| fetcher:<queue> | yes | stores answered | intake | workers enabled, one per queue (cut off at the grace's end) |

The phases stop in :class:`~taskmesh.runtime.service_runner.StopPhase` order: fires, intake,
results, upkeep. Between intake and results the executors finish what they hold within the
grace period and hand back the rest (the supervisor's drain). Rows start in the table's order.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import partial

import anyio

from taskmesh.api.state import AppState
from taskmesh.config import Settings
from taskmesh.limits.book import LimitBook
from taskmesh.observability.metrics import Metrics
from taskmesh.runtime import worker_processes
from taskmesh.runtime.clock import StoreClock
from taskmesh.runtime.process_pool import ProcessPool
from taskmesh.runtime.service_runner import Row, StopPhase
from taskmesh.schedules.schedules import NOTIFY_CHANNEL, Schedules
from taskmesh.services import (
    clock_sync,
    delayed_mover,
    denial_summaries,
    enqueued_listener,
    finished_feed,
    heartbeat,
    limits_watch,
    operations,
    reclaimer,
    reconciler,
    retention,
    sampler,
    scheduler,
)
from taskmesh.services.committer import Committer
from taskmesh.services.run_tally import RunTally
from taskmesh.services.supervision import ServiceSpec
from taskmesh.services.sync_handlers import HandlerThreads, SyncHandlers
from taskmesh.services.worker_pool import QueueWorkers
from taskmesh.store import Stores
from taskmesh.store.postgres import Listener
from taskmesh.tasks.advertised import AdvertisedHandlers, handled_names, handler_options
from taskmesh.tasks.queued_quota import QueuedLimits
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.workflows.spec import WorkflowLimits
from taskmesh.workflows.workflows import Workflows

COMMIT_DEADLINE_SECONDS = 5.0
"""How long the stopping committer may write what it holds (1 s after a second signal)."""


@dataclass
class Serving:
    """An instance's live objects once its stores answered."""

    stores: Stores
    tasks: Tasks
    clock: StoreClock
    committer: Committer
    pools: list[QueueWorkers]
    tally: RunTally

    def held(self) -> set[uuid.UUID]:
        """Runs this instance holds: claimed and not submitted, or submitted and not written."""
        held = set(self.committer.unwritten)
        for pool in self.pools:
            held.update(pool.claimed)
        return held

    async def hold_slots(self, lease_seconds: float) -> None:
        """Keep the limit slots of the runs this instance's executors hold until ``lease_seconds`` from now.

        :raises StoreError: Redis failed.
        """
        until = self.stores.redis.now_ms() + round(lease_seconds * 1000)
        for pool in self.pools:
            claimed = list(pool.claimed.values())
            runs = [(t.task_id, list(t.limit_keys)) for t in claimed if t.limit_keys]
            await self.stores.redis.limits.hold(pool.queue, runs, until)
            pool.releaser.extend([task_id for task_id, _ in runs], until)

    def cancel_run(self, task_id: uuid.UUID) -> bool:
        """Cancel the run of ``task_id`` if an executor here runs it."""
        return any(pool.cancel(task_id) for pool in self.pools)

    def in_flight_by_queue(self) -> dict[str, int]:
        """Runs in flight here, by queue."""
        return {pool.queue: pool.in_flight() for pool in self.pools}

    def popped(self, queue: str) -> set[str]:
        """Ids of ``queue`` popped from Redis and not claimed yet (``reconciler.Popped``)."""
        return set().union(*(pool.popped for pool in self.pools if pool.queue == queue))

    def release(self) -> None:
        """Close the committer's and the queues' channels, once every service using them has stopped."""
        self.committer.release()
        for pool in self.pools:
            pool.release()


@dataclass
class Parts:
    """What the service table is built from: one instance's settings, events and, once up, its live objects.

    :param intake: set in the intake phase: the fetchers and the worker processes stop on it.
    :param force: set on a second signal (the worker processes are signalled again, the commit cut short).
    """

    settings: Settings
    registry: Registry
    worker_id: str
    state: AppState
    metrics: Metrics
    intake: anyio.Event
    force: anyio.Event
    serving: Serving | None = None


def service_table(p: Parts) -> list[Row]:
    """Every service of the instance as a row (see module docs); those needing the stores once they answered.

    Built once when HTTP is bound (``p.serving`` is ``None``) and once the stores answered: the
    supervisor starts each row the first time the table lists it.
    """
    s = p.settings

    def stop_intake(_scope: anyio.CancelScope) -> None:
        p.intake.set()

    table = [Row(spec, StopPhase.INTAKE, stop=stop_intake) for spec in worker_processes.specs(s, p.intake, p.force)]
    if p.serving is None:
        return table
    up = p.serving

    def close_committer(scope: anyio.CancelScope) -> None:
        up.committer.close()
        # It writes what it holds; bounded, so a dead store cannot hold the exit.
        scope.deadline = anyio.current_time() + (1 if p.force.is_set() else COMMIT_DEADLINE_SECONDS)

    table.append(Row(ServiceSpec("committer", up.committer.run, critical=True), StopPhase.RESULTS, close_committer))
    table += [Row(spec, StopPhase.UPKEEP) for spec in _upkeep(p, up)]

    fires = _scheduler_spec(p, up)
    if fires is not None:
        table.append(Row(fires, StopPhase.FIRES))
    for pool in up.pools:
        fetcher = ServiceSpec(f"fetcher:{pool.queue}", pool.fetch, critical=True)
        # Once it stopped, the queue's executors drain what the channel holds, then return. A fetcher
        # waiting for a free slot, or on a store in an outage, is cut off when the grace period ends.
        table.append(Row(fetcher, StopPhase.INTAKE, stop=stop_intake, ended=pool.close_fetching, graced=True))
    return table


def _upkeep(p: Parts, up: Serving) -> list[ServiceSpec]:
    """The heartbeat and the maintenance services: they stop last, once every result is written."""
    s, tasks, queues = p.settings, up.tasks, list(p.settings.queue_names)
    concurrency = {q: s.concurrency_of(q) for q in queues}
    table: list[ServiceSpec] = []
    if s.workers_enabled:
        beat = partial(
            heartbeat.run,
            up.stores.pg,
            p.worker_id,
            concurrency,
            lease_seconds=s.lease_seconds,
            interval=s.lease_seconds / 3,
            held=up.held,
            is_draining=lambda: p.state.draining,
            cancel=up.cancel_run,
            metrics=p.metrics,
            handlers=handled_names(p.registry),
            handler_options=handler_options(p.registry),
            hold_slots=partial(up.hold_slots, s.lease_seconds),  # limits set at run time too
        )
        table.append(ServiceSpec("heartbeat", beat, critical=True))
    table += [
        ServiceSpec("clock_sync", partial(clock_sync.run, up.stores.pg, up.clock, p.metrics), critical=False),
        ServiceSpec("limits_watch", partial(limits_watch.run, up.stores.pg, tasks.limits), critical=False),
        ServiceSpec(
            "delayed_mover",
            partial(delayed_mover.run, up.stores.redis, queues, interval=s.delayed_poll_seconds, limits=tasks.limits),
            critical=True,
        ),
        ServiceSpec(
            "reclaimer",
            partial(reclaimer.run, tasks, lease_seconds=s.lease_seconds, interval=s.reclaim_interval_seconds),
            critical=True,
        ),
        ServiceSpec(
            "reconciler",
            partial(
                reconciler.run,
                tasks,
                queues,
                instance=p.worker_id,
                sweep_interval=s.reconcile_interval_seconds,
                popped=up.popped,
            ),
            critical=True,
        ),
        ServiceSpec(
            "retention",
            partial(
                retention.run,
                up.stores.pg,
                up.stores.redis,
                s.retention_seconds(),
                stats_seconds=s.retention_stats_days * 86400,
                audit_keep_days=s.retention_audit_days,
            ),
            critical=False,
        ),
        ServiceSpec(
            "sampler",
            partial(
                sampler.run,
                up.stores,
                p.metrics,
                queues,
                interval=s.metrics_sample_seconds,
                in_flight=up.in_flight_by_queue,
                tally=up.tally,
                limits=tasks.limits,
            ),
            critical=False,
        ),
        ServiceSpec("operations", partial(operations.run, tasks, p.worker_id), critical=False),
    ]
    if s.listen_url is not None:  # behind a transaction pooler, the reconciler's sweep pushes them instead
        table.append(
            ServiceSpec("enqueued_listener", partial(enqueued_listener.run, s.listen_url, tasks), critical=False)
        )
    if s.api_enabled:
        table.append(
            ServiceSpec("finished_feed", partial(finished_feed.run, up.stores.redis, p.state.waiters), critical=False)
        )
        table.append(
            ServiceSpec(
                "denial_summaries", partial(denial_summaries.run, up.stores.pg, p.state.denials), critical=False
            )
        )
    return table


def _scheduler_spec(p: Parts, up: Serving) -> ServiceSpec | None:
    s = p.settings
    if not (s.scheduler_enabled and s.schedules and p.state.schedules is not None):
        return None
    waker = p.state.schedule_waker
    if s.listen_url is None:
        # A transaction pooler loses LISTEN: re-read the table every pg_poll_seconds instead.
        run = partial(scheduler.run, p.state.schedules, up.clock, waker, max_sleep=s.pg_poll_seconds)
    else:
        listener = Listener(s.listen_url, NOTIFY_CHANNEL, lambda _payload: waker.wake())
        run = partial(scheduler.run, p.state.schedules, up.clock, waker, listener=listener)
    return ServiceSpec("scheduler", run, critical=False)


def build_serving(p: Parts, stores: Stores, clock: StoreClock, threads: HandlerThreads) -> tuple[Serving, ProcessPool]:
    """The live objects the table's store-bound rows run on: the task facade, the committer, the queues' pools.

    Also sets the API's facades in ``p.state``. Returns the handler process pool too, which the
    supervisor closes after the hand-back.

    :param threads: ``def`` handlers running in threads (the emergency exit watches them).
    """
    settings, registry, metrics = p.settings, p.registry, p.metrics
    tasks = Tasks(
        stores.pg,
        stores.redis,
        registry=registry,
        default_max_retries=settings.default_max_retries,
        metrics=metrics,
        max_delay_seconds=settings.max_delay_seconds,
        queued_limits=QueuedLimits.of_settings(settings),
        advertised=AdvertisedHandlers(fresh_seconds=3 * settings.lease_seconds),
        workflow_parents_max_bytes=settings.workflow_parents_max_bytes,
        limits=LimitBook.of_settings(settings),
    )
    p.state.stores, p.state.tasks = stores, tasks
    p.state.schedules = Schedules(tasks, settings.schedules)
    p.state.workflows = Workflows(
        tasks, WorkflowLimits(max_nodes=settings.workflow_max_nodes, map_max_items=settings.workflow_map_max_items)
    )
    queues = list(settings.queue_names)
    concurrency = {q: settings.concurrency_of(q) for q in queues}
    metrics.prepare(queues, concurrency if settings.workers_enabled else {})
    total = sum(concurrency.values())
    # def handlers in thread mode run in anyio's worker threads: allow one per executor.
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(limiter.total_tokens, total)
    committer = Committer(
        tasks,
        p.worker_id,
        batch_size=settings.commit_batch_size,
        flush_ms=settings.commit_flush_ms,
        interval_ms=settings.commit_interval_ms,
        capacity=max(1024, 4 * total),
    )
    processes = ProcessPool(
        settings.sync_processes or max(1, total),
        log_level=settings.log_level,
        log_format="json" if settings.log_format == "auto" else settings.log_format,
        stop_grace_seconds=settings.sync_stop_grace_seconds,
        preload=settings.handlers,
    )
    sync = SyncHandlers(processes, default=settings.sync_pool, worker_id=p.worker_id, threads=threads)
    tally = RunTally()
    pools = [
        QueueWorkers(
            queue,
            tasks=tasks,
            registry=registry,
            committer=committer,
            worker_id=p.worker_id,
            concurrency=concurrency[queue],
            prefetch=settings.prefetch_of(queue),
            lease_seconds=settings.lease_seconds,
            stop=p.intake,
            metrics=metrics,
            log_payloads=settings.log_payloads,
            sync=sync,
            now=clock.timestamp,
            tally=tally,
        )
        for queue in (queues if settings.workers_enabled else [])
    ]
    return Serving(stores, tasks, clock, committer, pools, tally), processes
