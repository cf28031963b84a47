"""The supervisor: signals, the HTTP lifecycle, connect and migrate, and the service table's start and stop.

Start order: bind the HTTP socket and serve (``/readyz`` says 503 until the
stores answer); start the rows of the service table that need no store (the
worker processes, :mod:`taskmesh.runtime.worker_processes`); connect to
PostgreSQL and Redis with backoff, logging ``store_unavailable`` once per outage
and naming the store; measure PostgreSQL's clock; migrate under the advisory
lock (a migration that fails for good stops the start with exit status 1, it is
not an outage); register the instance (its first heartbeat, through outages);
then start the other rows of :func:`~taskmesh.runtime.services_table.service_table`
in its order, each under the crash policy (``services/supervision.py``), and
per queue the executors.

Shutdown (SIGTERM or SIGINT, ``Instance.stop``, or a critical service past its
restart budget): ``/readyz`` turns 503 (draining) at once; then the table's
rows stop by their stop phase, each phase once the one before has ended
(:class:`~taskmesh.runtime.service_runner.StopPhase`): *fires*, the scheduler
makes no new fires; *intake*, the fetchers claim nothing more and the worker
processes are told to drain in the same grace period; then the executors finish
what they hold within ``shutdown_grace_seconds`` while the heartbeat keeps their
leases, and runs still unfinished then, and claimed tasks never started, are
handed back (requeued now, no retry spent, ``error`` says interrupted);
*results*, the committer writes every result (bounded to 5 s, so a dead store
cannot hold the exit; what it could not write is logged); *upkeep*, the
heartbeat and the maintenance services stop. Each row's end is logged
(``service_stopped``). Then the instance deregisters; HTTP stops; the stores
close. A second signal ends the grace period at once and still hands back what
it can. A thread-mode ``def`` handler still running 3 s past the grace period
(at once on a second signal) cannot be stopped: the emergency exit
(``emergency.py``) hands its run back and ends the process. After a critical
service's failure the instance raises :class:`~taskmesh.errors.ServiceFailedError`
once it has shut down (exit 1).
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from taskmesh import __version__, extras
from taskmesh.api.policy import NO_KEY, app_state, may_serve
from taskmesh.api.state import AppState
from taskmesh.config import Settings, check_schedule_tasks, require_stores
from taskmesh.errors import ConfigError, MigrationError, ServiceFailedError, StoreError
from taskmesh.observability.logs import get_logger, run_keys, store_address
from taskmesh.observability.metrics import Metrics, current_metrics
from taskmesh.runtime import emergency, notify, worker_processes
from taskmesh.runtime.clock import StoreClock
from taskmesh.runtime.connect import connect_until_stopped
from taskmesh.runtime.loop_monitor import LoopMonitor
from taskmesh.runtime.service_runner import ServiceRunner, StopPhase
from taskmesh.runtime.services_table import Parts, Serving, build_serving, service_table
from taskmesh.runtime.shutdown_signals import ShutdownSignals
from taskmesh.services import heartbeat
from taskmesh.services.base import call_until_done
from taskmesh.services.supervision import RestartBudget
from taskmesh.services.sync_handlers import HandlerThreads
from taskmesh.store import Stores
from taskmesh.store.redis_clients import is_sentinel_url
from taskmesh.tasks.advertised import handled_names, handler_options
from taskmesh.tasks.models import Outcome, RunResult
from taskmesh.tasks.registry import Registry

if TYPE_CHECKING:
    from taskmesh.api.listeners import HttpListener

log = get_logger("taskmesh.runtime.supervisor")

INTERRUPTED_ERROR = "interrupted: instance shut down before the run finished"


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
    services: ServiceRunner | None = None
    """The service table's runner once HTTP is bound: its ``rows`` as started, the order they ``stopped`` in."""

    def service_failed(self, name: str, crashes: int) -> None:
        """A critical service ``name`` exhausted its restart budget after ``crashes``: stop, and exit 1 after."""
        if self.failed is None:
            self.failed = (name, crashes)
        self.stop.set()


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
    http = _http_module(settings)
    database_url, redis_url = require_stores(settings)
    check_schedule_tasks(settings, set(registry.names()), registry.fallback is not None)
    inst = instance or Instance()
    inst.freeze_heap = signals if freeze_heap is None else freeze_heap
    inst.budget = RestartBudget(settings.service_restarts, settings.service_restart_window_seconds)
    metrics = Metrics(task_names=registry, queues=settings.queue_names)  # bounded labels
    current_metrics.set(metrics)  # this task and the services it starts count their store errors here
    state = inst.state = app_state(settings, metrics, handled_names(registry))
    listeners: list[HttpListener] = [] if http is None else http.bind_listeners(settings, state, metrics)
    inst.port = listeners[0].port if listeners else None
    inst.metrics_port = listeners[-1].port if listeners and settings.metrics_port is not None else None
    log.info(
        "instance_starting",
        worker_id=inst.worker_id,
        version=__version__,
        http=f"{settings.http_host}:{inst.port}" if listeners else None,
        metrics_http=None if len(listeners) < 2 else f"{listeners[-1].host}:{inst.metrics_port}",
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
    parts = Parts(settings, registry, inst.worker_id, state, metrics, intake=anyio.Event(), force=inst.force)
    try:
        with guard:
            await _run_root(parts, inst, listeners, monitor, (database_url, redis_url), fatal)
    finally:
        # The server closes its sockets when it stops; not one cancelled before it started serving.
        for listener in listeners:
            listener.sock.close()
    log.info("instance_stopped", worker_id=inst.worker_id)
    if fatal:
        raise fatal[0]
    if inst.failed is not None:
        raise ServiceFailedError(*inst.failed)


def _http_module(settings: Settings) -> Any:
    """:mod:`taskmesh.api.listeners` (imported here: it loads FastAPI and uvicorn), or ``None`` with
    ``http_enabled`` off.

    :raises MissingExtraError: HTTP is on and the ``server`` extra is not installed.
    :raises ConfigError: ``metrics_port`` is set with ``http_enabled`` off.
    """
    if not settings.http_enabled:
        if settings.metrics_port is not None:
            raise ConfigError("metrics_port: set, but http_enabled is off (no HTTP listener at all)")
        return None
    extras.require_extra(
        "server",
        "the HTTP API (taskmesh run, python -m taskmesh)",
        hint="or run workers alone, without HTTP: taskmesh worker",
    )
    from taskmesh.api import listeners

    return listeners


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
    p: Parts,
    inst: Instance,
    listeners: list[HttpListener],
    monitor: LoopMonitor,
    urls: tuple[str, str],
    fatal: list[BaseException],
) -> None:
    """The instance's root task group: HTTP, the loop monitor, the watchdog, the table's rows, the stores' work."""
    settings, state = p.settings, p.state
    api = listeners[0] if listeners else None
    runner = inst.services = ServiceRunner(inst.worker_id, state.services, inst.budget, p.metrics, inst.service_failed)

    async def stop_http() -> None:
        async with anyio.create_task_group() as tg:
            for listener in listeners:
                tg.start_soon(listener.stop)

    async with anyio.create_task_group() as root:
        root.start_soon(monitor.run)
        for listener in listeners:
            root.start_soon(listener.serve)
        for row in service_table(p):  # the rows that need no store: the worker processes
            runner.start(root, row)
        # Without HTTP a running loop is the liveness the watchdog pings for.
        root.start_soon(notify.watchdog, lambda: api is None or (api.server.started and not api.done.is_set()))
        inst.serving.set()
        http = f"HTTP on {settings.http_host}:{inst.port}" if api else "no HTTP"
        notify.status(f"connecting to PostgreSQL and Redis; {http}")
        clock = StoreClock()
        try:
            stores = await connect_until_stopped(settings, *urls, clock, inst.stop, state.startup, state.schema)
        except (ConfigError, MigrationError, StoreError) as exc:
            fatal.append(exc)
            stores = None
        if stores is not None and not await may_serve(settings, state, stores):
            fatal.append(ConfigError(NO_KEY.format(host=settings.http_host)))
            await stores.close()
            stores = None
        if stores is not None:
            try:
                await _serve(p, stores, clock, inst, runner)
            finally:
                with anyio.CancelScope(shield=True):
                    await stop_http()
                    state.tasks = state.schedules = state.stores = None
                    await stores.close()
        else:
            notify.stopping("stopped before the stores answered")
        inst.stop.set()
        await stop_http()
        # Rows still running (the worker processes, when the stores never answered) stop in phase order too.
        # Each child is SIGKILLed past its bound; a crashed one's backoff (at most 10 s) ends with this one.
        with anyio.move_on_after(settings.shutdown_grace_seconds + worker_processes.STOP_MARGIN_SECONDS + 1):
            await runner.stop_all()
        root.cancel_scope.cancel()


async def _serve(p: Parts, stores: Stores, clock: StoreClock, inst: Instance, runner: ServiceRunner) -> None:
    """Register, run the table's store-bound rows and the executors until the stop, then deregister."""
    settings = p.settings
    p.serving, processes = build_serving(p, stores, clock, inst.handler_threads)
    try:
        if settings.workers_enabled:
            # Register before the first claim, so that no run of ours looks orphaned to a reclaimer.
            async def register() -> None:
                await heartbeat.run_once(
                    stores.pg,
                    inst.worker_id,
                    {q: settings.concurrency_of(q) for q in settings.queue_names},
                    lease_seconds=settings.lease_seconds,
                    metrics=p.metrics,
                    handlers=handled_names(p.registry),
                    handler_options=handler_options(p.registry),
                )

            await call_until_done("heartbeat", register)
        try:
            await _run_services(p, p.serving, inst, runner)
        finally:
            with anyio.CancelScope(shield=True):
                await processes.aclose()  # after the hand-back: a run cut off by the grace was stopped already
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    if settings.workers_enabled:
                        await stores.pg.workers.deregister(inst.worker_id)
                except StoreError as exc:
                    log.warning("deregister_failed", error=str(exc))
    finally:
        # Every service on these channels ran in _run_services's task group, which has exited.
        p.serving.release()


async def _run_services(p: Parts, up: Serving, inst: Instance, runner: ServiceRunner) -> None:
    """Start the table's rows in order and the executors, wait for the stop, stop the rows phase by phase."""
    settings = p.settings
    grace = anyio.CancelScope()
    executing, executed = anyio.Event(), anyio.Event()
    started = {row.name for row in runner.rows}
    rows = [row for row in service_table(p) if row.name not in started]

    async def execute() -> None:
        """The executors and the graced rows (the fetchers), all cut off when the grace period ends."""
        try:
            with grace:
                async with anyio.create_task_group() as work:
                    for row in rows:
                        if row.graced:
                            runner.start(work, row)
                    for pool in up.pools:
                        work.start_soon(pool.execute)
                    executing.set()
        finally:
            executing.set()
            executed.set()

    async def end_grace_on_force() -> None:
        await inst.force.wait()
        grace.cancel()

    async def drain() -> None:
        """Between intake and results: the executors finish within the grace, the rest goes back."""
        await executed.wait()
        await _hand_back(up, inst.worker_id)

    async with anyio.create_task_group() as services:
        for row in rows:
            if not row.graced:
                runner.start(services, row)
        services.start_soon(execute)
        services.start_soon(end_grace_on_force)
        await executing.wait()  # every row is started, so that the stop reaches each
        if inst.freeze_heap:
            gc.freeze()
        inst.ready.set()
        n = sum(pool.concurrency for pool in up.pools)
        serving = f"{n} executors on {', '.join(pool.queue for pool in up.pools)}" if up.pools else "no workers"
        http = f"HTTP on port {inst.port}" if inst.port is not None else "no HTTP"
        notify.ready(f"ready: {serving}; {http}")
        log.info("instance_ready", worker_id=inst.worker_id)
        await inst.stop.wait()
        p.state.draining = True
        in_flight = sum(pool.in_flight() for pool in up.pools)
        notify.stopping(f"draining {in_flight} runs, grace {settings.shutdown_grace_seconds:g} s")
        log.info("draining", in_flight=in_flight, grace_s=settings.shutdown_grace_seconds)
        # The grace period counts from the signal, which a blocked loop may have heard late.
        waited = time.monotonic() - inst.stop_requested_at if inst.stop_requested_at is not None else 0.0
        grace.deadline = anyio.current_time() + max(0.0, settings.shutdown_grace_seconds - waited)
        with anyio.CancelScope(shield=True):
            await runner.stop_all(after={StopPhase.INTAKE: drain})
        services.cancel_scope.cancel()


async def _hand_back(up: Serving, worker_id: str) -> None:
    """Runs unfinished after the grace period, and claimed tasks never started, go back (requeued now)."""
    handed_back = [task for pool in up.pools for task in pool.unfinished()]
    for task in handed_back:
        await up.committer.submit(RunResult(task, Outcome.INTERRUPTED, error=INTERRUPTED_ERROR))
    if handed_back:
        log.warning("runs_handed_back", count=len(handed_back))
        for task in handed_back:
            log.info("run_handed_back", **run_keys(task, worker_id))
