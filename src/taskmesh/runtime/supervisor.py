"""The supervisor: signals, the HTTP lifecycle, connect and migrate, and the service table.

Start order: bind the HTTP socket and serve (``/readyz`` says 503 until the
stores answer); connect to PostgreSQL and Redis with backoff, logging
``store_unavailable`` once per outage and naming the store; measure
PostgreSQL's clock; migrate under the advisory lock (a migration that fails
for good stops the start with exit status 1, it is not an outage); register
the instance (its first heartbeat, through outages); then start the services
of :func:`service_table` in its order, each under the crash policy
(``services/supervision.py``), and per queue the executors and the fetcher.
With ``worker_processes`` above 1 the children (:mod:`taskmesh.runtime.worker_processes`)
start as soon as the HTTP socket is bound, and the instance exits after them.

Shutdown (SIGTERM or SIGINT, ``Instance.stop``, or a critical service past its
restart budget), the table's order reversed: ``/readyz`` turns 503 (draining)
at once; the scheduler stops firing; fetchers stop; executors finish what they
hold within ``shutdown_grace_seconds`` while the heartbeat keeps their leases;
runs still unfinished then, and claimed tasks never started, are handed back
(requeued now, no retry spent, ``error`` says interrupted); the committer
writes every result (bounded to 5 s, so a dead store cannot hold the exit;
what it could not write is logged); the maintenance services stop; the
instance deregisters; HTTP stops; the stores close. A second signal ends the
grace period at once and still hands back what it can. Exit comes within
grace + 15 s. A thread-mode ``def`` handler still running 3 s past the grace
period (at once on a second signal) cannot be stopped: the emergency exit
(``emergency.py``) hands its run back and ends the process. After a critical service's failure the instance raises
:class:`~taskmesh.errors.ServiceFailedError` once it has shut down (exit 1).
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio

from taskmesh import __version__
from taskmesh.api.listeners import HttpListener, bind_listeners, is_loopback
from taskmesh.api.principals import KeyCache, RatePolicy
from taskmesh.api.quotas import Quotas
from taskmesh.api.state import AppState, ServedQueues
from taskmesh.config import Settings, check_schedule_tasks, require_stores
from taskmesh.errors import ConfigError, MigrationError, ServiceFailedError, StoreError
from taskmesh.observability.logs import get_logger, run_keys, store_address
from taskmesh.observability.metrics import Metrics, current_metrics
from taskmesh.runtime import emergency, notify, worker_processes
from taskmesh.runtime.clock import StoreClock
from taskmesh.runtime.loop_monitor import LoopMonitor
from taskmesh.runtime.process_pool import ProcessPool
from taskmesh.runtime.shutdown_signals import ShutdownSignals
from taskmesh.schedules.schedules import NOTIFY_CHANNEL, Schedules
from taskmesh.services import (
    clock_sync,
    delayed_mover,
    denial_summaries,
    enqueued_listener,
    finished_feed,
    heartbeat,
    operations,
    reclaimer,
    reconciler,
    retention,
    sampler,
    scheduler,
)
from taskmesh.services.base import Outage, call_until_done
from taskmesh.services.committer import Committer
from taskmesh.services.run_tally import RunTally
from taskmesh.services.supervision import RestartBudget, ServiceSpec, supervise
from taskmesh.services.sync_handlers import HandlerThreads, SyncHandlers
from taskmesh.services.worker_pool import QueueWorkers
from taskmesh.store import PgStore, RedisStore, Stores
from taskmesh.store.keys import Keys
from taskmesh.store.postgres import Listener
from taskmesh.store.redis_clients import is_sentinel_url
from taskmesh.tasks.advertised import AdvertisedHandlers, handler_options
from taskmesh.tasks.models import Outcome, RunResult
from taskmesh.tasks.queued_quota import QueuedLimits
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks

log = get_logger("taskmesh.runtime.supervisor")

INTERRUPTED_ERROR = "interrupted: instance shut down before the run finished"
COMMIT_DEADLINE_SECONDS = 5.0


@dataclass
class Instance:
    """Handle on a running instance, for the CLI and for tests.

    ``port`` is the bound HTTP port once ``serving`` is set (``metrics_port`` the
    metrics port's, when ``metrics_port`` is set); ``ready`` is set
    once the stores answered and every service runs; setting ``stop`` starts
    the graceful shutdown, as SIGTERM does; setting ``force`` as well ends the
    grace period at once, as a second signal does. ``failed`` names the
    critical service whose crashes stopped the instance, if any.
    """

    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}")
    port: int | None = None
    metrics_port: int | None = None
    serving: anyio.Event = field(default_factory=anyio.Event)
    ready: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)
    force: anyio.Event = field(default_factory=anyio.Event)
    state: AppState | None = None
    failed: tuple[str, int] | None = None
    budget: RestartBudget = field(default_factory=RestartBudget)
    stop_requested_at: float | None = None
    """``time.monotonic()`` of the signal that asked for the stop: the grace period counts from it."""
    freeze_heap: bool = False
    """Whether the ready instance freezes its heap (:func:`run`'s ``freeze_heap``)."""
    handler_threads: HandlerThreads = field(default_factory=HandlerThreads)
    """``def`` handlers running in threads, which no shutdown can stop (the watchdog reads it)."""

    def service_failed(self, name: str, crashes: int) -> None:
        """A critical service ``name`` exhausted its restart budget after ``crashes``: stop, and exit 1 after."""
        if self.failed is None:
            self.failed = (name, crashes)
        self.stop.set()


def handled_names(registry: Registry) -> list[str] | None:
    """The task names this instance advertises (``workers.handlers``); ``None``: any, it has a fallback."""
    return None if registry.fallback is not None else sorted(registry.names())


async def run(
    settings: Settings,
    registry: Registry,
    instance: Instance | None = None,
    *,
    signals: bool = True,
    freeze_heap: bool | None = None,
) -> None:
    """Run an instance until it is stopped (see module docs).

    :param signals: install SIGTERM/SIGINT handlers (off for in-process tests).
    :param freeze_heap: once ready, move every object alive to the collector's permanent generation
        (``gc.freeze()``): the modules, the app and the services live as long as the process, and
        a full collection no longer walks them again and again while tasks run. By default as
        ``signals`` (an instance that owns its process); never in a test's process, whose objects
        it would keep.
    :raises ConfigError: ``DATABASE_URL``/``REDIS_URL`` missing, a schedule names a task
        no handler runs, or the HTTP port cannot be bound.
    :raises MigrationError: a migration failed with an error retrying cannot fix.
    :raises ServiceFailedError: a critical service exhausted its restart budget (after
        the graceful shutdown it caused).
    """
    database_url, redis_url = require_stores(settings)
    check_schedule_tasks(settings, set(registry.names()), registry.fallback is not None)
    inst = instance or Instance()
    inst.freeze_heap = signals if freeze_heap is None else freeze_heap
    inst.budget = RestartBudget(settings.service_restarts, settings.service_restart_window_seconds)
    metrics = Metrics(task_names=registry, queues=settings.queue_names)  # bounded labels (issue 10, break 10)
    current_metrics.set(metrics)  # this task and the services it starts count their store errors here
    own = frozenset(settings.queue_names) if settings.workers_enabled else frozenset[str]()
    own_names = handled_names(registry)
    state = AppState(
        metrics=metrics,
        queues=list(settings.queue_names),
        served=ServedQueues(own=own, own_names=None if own_names is None else frozenset(own_names)),
        keys=KeyCache(enforce=settings.auth == "keys", loopback=is_loopback(settings.http_host)),
        metrics_protected=settings.metrics_auth == "scope",
        rate_policies=rate_policies(settings),
        rate_burst_seconds=settings.rate_limit_burst_seconds,
        auth_refusals=RatePolicy.of(settings.auth_refusals_per_minute / 60, 60.0),
        quotas=Quotas(settings.tenant_quotas, settings.tenant_quota_default, settings.rate_limit_burst_seconds),
        console_session_seconds=settings.console_session_hours * 3600,
    )
    inst.state = state
    listeners = bind_listeners(settings, state, metrics)
    inst.port = listeners[0].port
    inst.metrics_port = listeners[-1].port if settings.metrics_port is not None else None
    log.info(
        "instance_starting",
        worker_id=inst.worker_id,
        version=__version__,
        http=f"{settings.http_host}:{inst.port}",
        metrics_http=None if len(listeners) == 1 else f"{listeners[-1].host}:{inst.metrics_port}",
        queues={q: settings.concurrency_of(q) for q in settings.queue_names},
        handlers=registry.names(),
        fallback=registry.fallback.name if registry.fallback else None,
        redis_mode="sentinel" if is_sentinel_url(settings.redis_url or "") else settings.redis_mode,
        pg_pooler=settings.pg_pooler,
        database=store_address(database_url),
        redis=store_address(redis_url),
        redis_prefix=settings.redis_prefix,
    )
    fatal: list[BaseException] = []
    monitor = LoopMonitor(settings.loop_block_threshold_seconds, worker_id=inst.worker_id, metrics=metrics)
    guard: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if signals:
        guard = _signals(inst, monitor, settings, database_url)
    with guard:
        await _run_root(settings, registry, inst, state, metrics, listeners, monitor, database_url, redis_url, fatal)
    log.info("instance_stopped", worker_id=inst.worker_id)
    if fatal:
        raise fatal[0]
    if inst.failed is not None:
        raise ServiceFailedError(*inst.failed)


def _signals(inst: Instance, monitor: LoopMonitor, settings: Settings, database_url: str) -> ShutdownSignals:
    """SIGTERM/SIGINT heard also while the loop is blocked, with the emergency hand-back as last resort."""

    def first() -> None:
        inst.stop_requested_at = guard.requested_at
        inst.stop.set()

    guard = ShutdownSignals(
        on_first=first,
        on_second=inst.force.set,
        grace_seconds=settings.shutdown_grace_seconds,
        monitor=monitor,
        # A thread-mode def handler past the grace period holds the shutdown as a blocked loop does.
        threads=lambda: inst.handler_threads.running,
        emergency=partial(emergency.hand_back_and_exit, database_url, inst.worker_id),
    )
    return guard


async def _run_root(
    settings: Settings,
    registry: Registry,
    inst: Instance,
    state: AppState,
    metrics: Metrics,
    listeners: list[HttpListener],
    monitor: LoopMonitor,
    database_url: str,
    redis_url: str,
    fatal: list[BaseException],
) -> None:
    """The instance's root task group: HTTP, the loop monitor, the watchdog, then the stores' work."""
    api = listeners[0]

    async def stop_http() -> None:
        async with anyio.create_task_group() as tg:
            for listener in listeners:
                tg.start_soon(listener.stop)

    async with anyio.create_task_group() as root:
        root.start_soon(monitor.run)
        for listener in listeners:
            root.start_soon(listener.serve)
        children = worker_processes.start(
            root,
            settings,
            inst.stop,
            inst.force,
            state.services,
            budget=inst.budget,
            metrics=metrics,
            on_fatal=inst.service_failed,
        )
        root.start_soon(notify.watchdog, lambda: api.server.started and not api.done.is_set())
        inst.serving.set()
        notify.status(f"connecting to PostgreSQL and Redis; HTTP on {settings.http_host}:{inst.port}")
        clock = StoreClock()
        try:
            stores = await _connect_until_stopped(settings, database_url, redis_url, clock, inst.stop, state.startup)
        except (ConfigError, MigrationError, StoreError) as exc:
            fatal.append(exc)
            stores = None
        if stores is not None and not await _may_serve(settings, state, stores):
            fatal.append(ConfigError(NO_KEY.format(host=settings.http_host)))
            await stores.close()
            stores = None
        if stores is not None:
            try:
                await _serve(settings, registry, stores, clock, inst, state, metrics)
            finally:
                with anyio.CancelScope(shield=True):
                    await stop_http()
                    state.tasks = state.schedules = state.stores = None
                    await stores.close()
        else:
            notify.stopping("stopped before the stores answered")
        inst.stop.set()  # the worker processes stop with this one, whatever stopped it
        await stop_http()
        # Each child is SIGKILLed past its bound; a crashed one's backoff (at most 10 s) ends with this one.
        with anyio.move_on_after(settings.shutdown_grace_seconds + worker_processes.STOP_MARGIN_SECONDS + 1):
            await children.wait()
        root.cancel_scope.cancel()


NO_KEY = (
    "auth: the API listens on {host}, which is not a loopback address, and no active API key exists: make one "
    "with `taskmesh keys create --name admin --role admin` (it talks to DATABASE_URL directly), or set "
    'auth = "none" (TASKMESH_AUTH=none) to serve without keys'
)


def rate_policies(settings: Settings) -> dict[str, RatePolicy]:
    """The per-key rate limits of the settings, by class."""
    rates = {
        "read": settings.rate_limit_read_per_second,
        "write": settings.rate_limit_write_per_second,
        "admin": settings.rate_limit_admin_per_second,
    }
    return {name: RatePolicy.of(rate, settings.rate_limit_burst_seconds) for name, rate in rates.items()}


async def _may_serve(settings: Settings, state: AppState, stores: Stores) -> bool:
    """``False`` for an instance that would serve others with keys required and no key to use (issue 12).

    Says at start when the API is open: ``auth_disabled`` (``auth = "none"``), or ``auth_open``
    (loopback, no key yet; logged by the key cache, and ``auth_enforced`` once a key exists).
    """
    if not settings.api_enabled:  # a worker-only instance serves /healthz, /readyz and /metrics only
        return True
    if settings.auth != "keys":
        log.warning("auth_disabled", setting='auth = "none"', http=settings.http_host)
        return True
    any_key: list[bool] = []

    async def look() -> None:
        if state.keys.loopback:
            await state.keys.is_open(stores.pg)
            any_key.append(True)
        else:
            any_key.append(await stores.pg.keys.any_active())

    await call_until_done("postgres", look)
    return any_key[0]


async def _connect_until_stopped(
    settings: Settings,
    database_url: str,
    redis_url: str,
    clock: StoreClock,
    stop: anyio.Event,
    startup: dict[str, str],
) -> Stores | None:
    """Connect, measure PostgreSQL's clock and migrate, through outages; ``None`` when stopped first.

    PostgreSQL and Redis are tried side by side, each store's state kept in ``startup``
    (``connecting``, ``down``, ``ok``) for ``/readyz``, so that it names only the one that failed.

    :raises MigrationError: a migration failed for good.
    :raises ConfigError: a store refused the connection in a way retrying cannot fix (a refused
        password, a wrong database name, a failed TLS handshake, a Redis Cluster node; see
        ``RedisStore.check_server``): the message names ``database_url`` or ``redis_url``.
    :raises StoreError: a store failed for good after connecting (a query PostgreSQL refused).
    """
    result: list[Stores] = []
    failed: list[Exception] = []  # raised after the group: a child's error would come wrapped
    redis = RedisStore.connect(redis_url, Keys(settings.redis_prefix), mode=settings.redis_mode, now_ms=clock.now_ms)

    def down(store: str) -> Callable[[StoreError], None]:
        return lambda exc: startup.__setitem__(store, "down")

    async def open_postgres() -> PgStore:
        outage = Outage("postgres")
        while True:
            try:
                pg = await PgStore.connect(database_url, settings.pg_pool_size, pooler=settings.pg_pooler)
                break
            except StoreError as exc:
                if not exc.transient:
                    raise
                startup["postgres"] = "down"
                await outage.failed(exc)
        outage.recovered()
        try:
            await call_until_done("postgres", lambda: clock.sync(pg.now), on_failure=down("postgres"))
            if settings.migrate_on_start:
                await call_until_done("postgres", pg.migrate, on_failure=down("postgres"))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await pg.close()
            raise
        startup["postgres"] = "ok"
        return pg

    async def check_redis() -> None:
        await call_until_done("redis", redis.check_server, on_failure=down("redis"))
        startup["redis"] = "ok"

    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await stop.wait()
            tg.cancel_scope.cancel()

        async def connect() -> None:
            pg: list[PgStore] = []
            try:
                async with anyio.create_task_group() as both:
                    both.start_soon(check_redis)

                    async def postgres() -> None:
                        pg.append(await open_postgres())

                    both.start_soon(postgres)
            except* (MigrationError, StoreError) as group:
                failed.extend(
                    _refused_for_good(e) for e in group.exceptions if isinstance(e, MigrationError | StoreError)
                )
            if failed:
                with anyio.CancelScope(shield=True):
                    for store in pg:
                        await store.close()
            else:
                result.append(Stores(pg[0], redis))
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(connect)
    if not result:
        with anyio.CancelScope(shield=True):
            await redis.close()
    if failed:
        raise failed[0]
    return result[0] if result else None


def _refused_for_good(exc: MigrationError | StoreError) -> Exception:
    """A store's refusal to connect as the config error it is (exit 2, naming the setting)."""
    if not isinstance(exc, StoreError) or exc.transient or exc.operation != "connect":
        return exc
    if exc.store == "redis":
        return ConfigError(exc.detail)  # check_server's message names redis_url already
    return ConfigError(f"database_url: PostgreSQL refused the connection ({exc.detail})")


@dataclass
class _Parts:
    """What the service table is built from: one instance's live objects."""

    settings: Settings
    registry: Registry
    stores: Stores
    tasks: Tasks
    clock: StoreClock
    inst: Instance
    state: AppState
    metrics: Metrics
    committer: Committer
    pools: list[QueueWorkers]
    tally: RunTally

    def held(self) -> set[uuid.UUID]:
        """Runs this instance holds: claimed and not submitted, or submitted and not written."""
        held = set(self.committer.unwritten)
        for pool in self.pools:
            held.update(pool.claimed)
        return held

    def cancel_run(self, task_id: uuid.UUID) -> bool:
        return any(pool.cancel(task_id) for pool in self.pools)

    def in_flight_by_queue(self) -> dict[str, int]:
        return {pool.queue: pool.in_flight() for pool in self.pools}

    def popped(self, queue: str) -> set[str]:
        """Ids of ``queue`` popped from Redis and not claimed yet (``reconciler.Popped``)."""
        return set().union(*(pool.popped for pool in self.pools if pool.queue == queue))


def service_table(p: _Parts) -> list[ServiceSpec]:
    """The instance's maintenance services, in start order (stopped in the reverse order).

    | service | critical | when |
    | --- | --- | --- |
    | heartbeat | yes | workers enabled |
    | clock_sync | no | always |
    | delayed_mover, reclaimer, reconciler | yes | always |
    | retention | no | always (it also makes the audit log's months ahead) |
    | sampler | no | always |
    | operations | no | always |
    | enqueued_listener | no | ``LISTEN`` is reachable (not behind a transaction pooler alone) |
    | finished_feed | no | the API is served |
    | denial_summaries | no | the API is served (repeated refusals' audit rows) |

    The committer (critical, first to start, last of the work to stop), the
    scheduler (optional, stops first) and each queue's fetcher (critical) are
    started around these by :func:`_serve`, in that order.
    """
    s, tasks, queues = p.settings, p.tasks, list(p.settings.queue_names)
    concurrency = {q: s.concurrency_of(q) for q in queues}
    table: list[ServiceSpec] = []
    if s.workers_enabled:
        beat = partial(
            heartbeat.run,
            p.stores.pg,
            p.inst.worker_id,
            concurrency,
            lease_seconds=s.lease_seconds,
            interval=s.lease_seconds / 3,
            held=p.held,
            is_draining=lambda: p.state.draining,
            cancel=p.cancel_run,
            metrics=p.metrics,
            handlers=handled_names(p.registry),
            handler_options=handler_options(p.registry),
        )
        table.append(ServiceSpec("heartbeat", beat, critical=True))
    table += [
        ServiceSpec("clock_sync", partial(clock_sync.run, p.stores.pg, p.clock, p.metrics), critical=False),
        ServiceSpec(
            "delayed_mover",
            partial(delayed_mover.run, p.stores.redis, queues, interval=s.delayed_poll_seconds),
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
                instance=p.inst.worker_id,
                sweep_interval=s.reconcile_interval_seconds,
                popped=p.popped,
            ),
            critical=True,
        ),
    ]
    stats_seconds = s.retention_stats_days * 86400
    table.append(  # always: the audit log's months are made ahead by it
        ServiceSpec(
            "retention",
            partial(
                retention.run,
                p.stores.pg,
                p.stores.redis,
                s.retention_seconds(),
                stats_seconds=stats_seconds,
                audit_keep_days=s.retention_audit_days,
            ),
            critical=False,
        )
    )
    table.append(
        ServiceSpec(
            "sampler",
            partial(
                sampler.run,
                p.stores,
                p.metrics,
                queues,
                interval=s.metrics_sample_seconds,
                in_flight=p.in_flight_by_queue,
                tally=p.tally,
            ),
            critical=False,
        )
    )
    table.append(ServiceSpec("operations", partial(operations.run, p.tasks, p.inst.worker_id), critical=False))
    if s.listen_url is not None:  # behind a transaction pooler, the reconciler's sweep pushes them instead
        table.append(
            ServiceSpec("enqueued_listener", partial(enqueued_listener.run, s.listen_url, p.tasks), critical=False)
        )
    if s.api_enabled:
        table.append(
            ServiceSpec("finished_feed", partial(finished_feed.run, p.stores.redis, p.state.waiters), critical=False)
        )
        table.append(
            ServiceSpec("denial_summaries", partial(denial_summaries.run, p.stores.pg, p.state.denials), critical=False)
        )
    return table


def _scheduler_spec(p: _Parts) -> ServiceSpec | None:
    s = p.settings
    if not (s.scheduler_enabled and s.schedules and p.state.schedules is not None):
        return None
    waker = p.state.schedule_waker
    if s.listen_url is None:
        # A transaction pooler loses LISTEN: re-read the table every pg_poll_seconds instead.
        run = partial(scheduler.run, p.state.schedules, p.clock, waker, max_sleep=s.pg_poll_seconds)
    else:
        listener = Listener(s.listen_url, NOTIFY_CHANNEL, lambda _payload: waker.wake())
        run = partial(scheduler.run, p.state.schedules, p.clock, waker, listener=listener)
    return ServiceSpec("scheduler", run, critical=False)


async def _serve(
    settings: Settings,
    registry: Registry,
    stores: Stores,
    clock: StoreClock,
    inst: Instance,
    state: AppState,
    metrics: Metrics,
) -> None:
    tasks = Tasks(
        stores.pg,
        stores.redis,
        registry=registry,
        default_max_retries=settings.default_max_retries,
        metrics=metrics,
        max_delay_seconds=settings.max_delay_seconds,
        queued_limits=QueuedLimits.of_settings(settings),
        advertised=AdvertisedHandlers(fresh_seconds=3 * settings.lease_seconds),
    )
    state.stores, state.tasks = stores, tasks
    state.schedules = Schedules(tasks, settings.schedules)
    queues = list(settings.queue_names)
    concurrency = {q: settings.concurrency_of(q) for q in queues}
    metrics.prepare(queues, concurrency if settings.workers_enabled else {})
    total = sum(concurrency.values())
    # def handlers in thread mode run in anyio's worker threads: allow one per executor.
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(limiter.total_tokens, total)
    committer = Committer(
        tasks,
        inst.worker_id,
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
    sync = SyncHandlers(processes, default=settings.sync_pool, worker_id=inst.worker_id, threads=inst.handler_threads)
    tally = RunTally()
    pools = [
        QueueWorkers(
            queue,
            tasks=tasks,
            registry=registry,
            committer=committer,
            worker_id=inst.worker_id,
            concurrency=concurrency[queue],
            prefetch=settings.prefetch_of(queue),
            lease_seconds=settings.lease_seconds,
            stop=inst.stop,
            metrics=metrics,
            log_payloads=settings.log_payloads,
            sync=sync,
            now=clock.timestamp,
            tally=tally,
        )
        for queue in (queues if settings.workers_enabled else [])
    ]
    parts = _Parts(settings, registry, stores, tasks, clock, inst, state, metrics, committer, pools, tally)
    if settings.workers_enabled:
        # Register before the first claim, so that no run of ours looks orphaned to a reclaimer.
        async def register() -> None:
            await heartbeat.run_once(
                stores.pg,
                inst.worker_id,
                concurrency,
                lease_seconds=settings.lease_seconds,
                metrics=metrics,
                handlers=handled_names(registry),
                handler_options=handler_options(registry),
            )

        await call_until_done("heartbeat", register)
    try:
        await _run_services(parts)
    finally:
        with anyio.CancelScope(shield=True):
            await processes.aclose()  # after the hand-back: a run cut off by the grace was stopped already
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            try:
                if settings.workers_enabled:
                    await stores.pg.workers.deregister(inst.worker_id)
            except StoreError as exc:
                log.warning("deregister_failed", error=str(exc))


async def _run_services(p: _Parts) -> None:
    """Start the table in order, wait for the stop, stop everything in the reverse order."""
    inst, states, settings = p.inst, p.state.services, p.settings

    def supervised(
        spec: ServiceSpec, scope: anyio.CancelScope | None = None
    ) -> Callable[[], Coroutine[Any, Any, None]]:
        async def go() -> None:
            with scope or anyio.CancelScope():
                await supervise(spec, states, budget=inst.budget, metrics=p.metrics, on_fatal=inst.service_failed)

        return go

    grace = anyio.CancelScope()
    committer_scope = anyio.CancelScope()
    scheduler_scope = anyio.CancelScope()
    committed = anyio.Event()

    async def commit() -> None:
        try:
            await supervised(ServiceSpec("committer", p.committer.run, critical=True), committer_scope)()
        finally:
            committed.set()

    async def end_grace_on_force() -> None:
        await inst.force.wait()
        grace.cancel()

    async with anyio.create_task_group() as maintenance:
        maintenance.start_soon(commit)
        maintenance.start_soon(end_grace_on_force)
        for spec in service_table(p):
            maintenance.start_soon(supervised(spec))
        scheduler_spec = _scheduler_spec(p)
        if scheduler_spec is not None:
            maintenance.start_soon(supervised(scheduler_spec, scheduler_scope))
        with grace:
            async with anyio.create_task_group() as work:
                for pool in p.pools:
                    work.start_soon(pool.execute)
                    fetcher = ServiceSpec(f"fetcher:{pool.queue}", pool.fetch, critical=True)
                    work.start_soon(_fetch, pool, supervised(fetcher))
                if inst.freeze_heap:
                    gc.freeze()
                inst.ready.set()
                n = sum(pool.concurrency for pool in p.pools)
                serving = f"{n} executors on {', '.join(pool.queue for pool in p.pools)}" if p.pools else "no workers"
                notify.ready(f"ready: {serving}; HTTP on port {inst.port}")
                log.info("instance_ready", worker_id=inst.worker_id)
                await inst.stop.wait()
                p.state.draining = True
                scheduler_scope.cancel()  # a draining instance makes no new fires
                in_flight = sum(pool.in_flight() for pool in p.pools)
                notify.stopping(f"draining {in_flight} runs, grace {settings.shutdown_grace_seconds:g} s")
                log.info("draining", in_flight=in_flight, grace_s=settings.shutdown_grace_seconds)
                # The grace period counts from the signal, which a blocked loop may have heard late.
                waited = time.monotonic() - inst.stop_requested_at if inst.stop_requested_at is not None else 0.0
                grace.deadline = anyio.current_time() + max(0.0, settings.shutdown_grace_seconds - waited)
                # The group now waits for fetchers to stop and executors to finish what they hold.
        with anyio.CancelScope(shield=True):
            await _hand_back(p)
            p.committer.close()
            # The committer writes what it holds; bounded, so a dead store cannot hold the exit.
            committer_scope.deadline = anyio.current_time() + (1 if inst.force.is_set() else COMMIT_DEADLINE_SECONDS)
            await committed.wait()
        maintenance.cancel_scope.cancel()


async def _fetch(pool: QueueWorkers, fetcher: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a queue's supervised fetcher; once it stops, the executors drain the channel."""
    try:
        await fetcher()
    finally:
        pool.close_fetching()


async def _hand_back(p: _Parts) -> None:
    """Runs unfinished after the grace period, and claimed tasks never started, go back (requeued now)."""
    handed_back = [task for pool in p.pools for task in pool.unfinished()]
    for task in handed_back:
        await p.committer.submit(RunResult(task, Outcome.INTERRUPTED, error=INTERRUPTED_ERROR))
    if handed_back:
        log.warning("runs_handed_back", count=len(handed_back))
        for task in handed_back:
            log.info("run_handed_back", **run_keys(task, p.inst.worker_id))
