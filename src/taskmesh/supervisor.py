"""The supervisor: one anyio task group running every service of an instance.

Start order: bind the HTTP socket and serve (``/readyz`` says 503 until the
stores answer); connect to PostgreSQL and Redis with backoff, logging
``store_unavailable`` once per outage and naming the store; migrate under the
advisory lock; register the instance (first heartbeat); then start the
committer, the heartbeat, the delayed mover, the reclaimer, the reconciler,
the scheduler (when schedules are declared and ``scheduler_enabled``) and,
per queue, a fetcher and ``concurrency`` executors.

Shutdown (SIGTERM or SIGINT, or ``Instance.stop``): ``/readyz`` turns 503
(draining) at once; fetchers stop; executors finish what they hold within
``shutdown_grace_seconds`` while the heartbeat keeps their leases; runs still
unfinished then, and claimed tasks never started, are handed back (requeued
now, no retry spent, ``error`` says interrupted); the committer writes every
result (bounded to 5 s, so a dead store cannot hold the exit); the instance
deregisters; HTTP stops; the pools close. A second signal ends the grace
period at once and still hands back what it can. Exit comes within grace + 5 s
(plus the HTTP server's own stop, at most a few seconds more when clients
hold connections open).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import asyncpg
import structlog
import uvicorn
from anyio.streams.memory import MemoryObjectReceiveStream

from taskmesh import __version__, notify
from taskmesh.api.app import AppState, create_app
from taskmesh.api.server import Server as _Server
from taskmesh.api.server import bind_http
from taskmesh.clock import SystemClock
from taskmesh.config import Settings, check_schedule_tasks, require_stores
from taskmesh.metrics import Metrics, current_metrics
from taskmesh.models import ClaimedTask, Outcome, RunResult
from taskmesh.registry import Registry
from taskmesh.schedules import Schedules
from taskmesh.services import (
    committer,
    delayed_mover,
    executor,
    fetcher,
    heartbeat,
    reclaimer,
    reconciler,
    retention,
    sampler,
    scheduler,
)
from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.store import redis as rstore
from taskmesh.store.keys import Keys
from taskmesh.store.postgres import create_pool, migrate
from taskmesh.tasks import Tasks

log = structlog.get_logger("taskmesh.supervisor")

INTERRUPTED_ERROR = "interrupted: instance shut down before the run finished"


@dataclass
class Instance:
    """Handle on a running instance, for the CLI and for tests.

    ``port`` is the bound HTTP port once ``serving`` is set; ``ready`` is set
    once the stores answered and every service runs; setting ``stop`` starts
    the graceful shutdown, as SIGTERM does; setting ``force`` as well ends the
    grace period at once, as a second signal does.
    """

    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}")
    port: int | None = None
    serving: anyio.Event = field(default_factory=anyio.Event)
    ready: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)
    force: anyio.Event = field(default_factory=anyio.Event)
    state: AppState | None = None


async def run(
    settings: Settings, registry: Registry, instance: Instance | None = None, *, signals: bool = True
) -> None:
    """Run an instance until it is stopped (see module docs).

    :param signals: install SIGTERM/SIGINT handlers (off for in-process tests).
    :raises ConfigError: ``DATABASE_URL``/``REDIS_URL`` missing, a schedule names a task
        no handler runs, or the HTTP port cannot be bound.
    """
    database_url, redis_url = require_stores(settings)
    check_schedule_tasks(settings, set(registry.names()), registry.fallback is not None)
    inst = instance or Instance()
    metrics = Metrics()
    current_metrics.set(metrics)  # this task and the services it starts count their store errors here
    state = AppState(metrics=metrics, queues=list(settings.queue_names))
    inst.state = state
    sock = bind_http(settings.http_host, settings.http_port)
    inst.port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(state, api_enabled=settings.api_enabled),
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=3,
    )
    server = _Server(config)
    log.info(
        "instance_starting",
        worker_id=inst.worker_id,
        version=__version__,
        http=f"{settings.http_host}:{inst.port}",
        queues={q: settings.concurrency_of(q) for q in settings.queue_names},
        handlers=registry.names(),
        fallback=registry.fallback.name if registry.fallback else None,
    )
    http_done = anyio.Event()

    async def serve_http() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            http_done.set()

    async def stop_http() -> None:
        server.should_exit = True
        with anyio.move_on_after(5):
            await http_done.wait()

    async with anyio.create_task_group() as root:
        if signals:
            root.start_soon(_watch_signals, inst)
        root.start_soon(serve_http)
        root.start_soon(notify.watchdog, lambda: server.started and not http_done.is_set())
        inst.serving.set()
        notify.status(f"connecting to PostgreSQL and Redis; HTTP on {settings.http_host}:{inst.port}")
        stores = await _connect_until_stopped(settings, database_url, redis_url, inst.stop)
        if stores is not None:
            pool, client = stores
            tasks = Tasks(
                pool,
                client,
                Keys(settings.redis_prefix),
                registry=registry,
                default_max_retries=settings.default_max_retries,
                metrics=metrics,
            )
            state.tasks = tasks
            state.schedules = Schedules(tasks, settings.schedules)
            try:
                await _work(settings, registry, tasks, inst, state)
            finally:
                with anyio.CancelScope(shield=True):
                    await stop_http()
                    state.tasks = None
                    state.schedules = None
                    await client.aclose()
                    with anyio.move_on_after(3) as closing:
                        await pool.close()
                    if closing.cancelled_caught:  # a dead server cannot hold the exit
                        pool.terminate()
        else:
            notify.stopping("stopped before the stores answered")
        await stop_http()
        root.cancel_scope.cancel()
    log.info("instance_stopped", worker_id=inst.worker_id)


async def _watch_signals(inst: Instance) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        async for signum in received:
            if not inst.stop.is_set():
                log.info("shutdown_requested", signal=signal.Signals(signum).name)
                inst.stop.set()
            else:
                log.warning("shutdown_forced", signal=signal.Signals(signum).name)
                inst.force.set()


async def _connect_until_stopped(
    settings: Settings, database_url: str, redis_url: str, stop: anyio.Event
) -> tuple[asyncpg.Pool, rstore.Redis] | None:
    """Connect (and migrate) with backoff; ``None`` when stopped first."""
    result: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await stop.wait()
            tg.cancel_scope.cancel()

        async def connect() -> None:
            pg_outage = Outage("postgres")
            pool = None
            while pool is None:
                try:
                    pool = await create_pool(database_url, settings.pg_pool_size)
                    if settings.migrate_on_start:
                        async with pool.acquire() as conn:
                            await migrate(conn)
                except STORE_ERRORS as exc:
                    if pool is not None:
                        await pool.close()
                        pool = None
                    await pg_outage.failed(exc)
            pg_outage.recovered()
            client = rstore.create_client(redis_url)
            redis_outage = Outage("redis")
            while True:
                try:
                    await client.ping()
                    break
                except STORE_ERRORS as exc:
                    await redis_outage.failed(exc)
            redis_outage.recovered()
            result.extend([pool, client])
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(connect)
    return (result[0], result[1]) if result else None


async def _work(settings: Settings, registry: Registry, tasks: Tasks, inst: Instance, state: AppState) -> None:
    queues = list(settings.queue_names)
    concurrency = {q: settings.concurrency_of(q) for q in queues}
    if tasks.metrics is not None:
        tasks.metrics.prepare(queues, concurrency if settings.workers_enabled else {})
    total = sum(concurrency.values())
    # Sync handlers run in anyio's worker threads: allow one per executor (anyio's default is 40).
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(limiter.total_tokens, total)
    results_send, results_recv = anyio.create_memory_object_stream[RunResult](max(1024, 4 * total))
    inflight: dict[Any, ClaimedTask] = {}
    cancels: dict[uuid.UUID, anyio.CancelScope] = {}
    buffers: list[MemoryObjectReceiveStream[ClaimedTask]] = []

    def cancel_run(task_id: uuid.UUID) -> bool:
        scope = cancels.get(task_id)
        if scope is None:
            return False
        scope.cancel()
        held = next((t for t in list(inflight.values()) if t.task_id == task_id), None)
        if held is not None:
            log.info("run_cancel_requested", **executor.log_keys(held, inst.worker_id))
        return True

    # Register before the first claim, so that no run of ours looks orphaned to a reclaimer.
    if settings.workers_enabled:
        await heartbeat.run_once(tasks, inst.worker_id, concurrency, lease_seconds=settings.lease_seconds)
    maintenance = anyio.CancelScope()
    grace = anyio.CancelScope()

    async def end_grace_on_force() -> None:
        await inst.force.wait()
        grace.cancel()

    async def schedule(schedules: Schedules) -> None:
        # A draining instance makes no new fires: the other instances carry on.
        async with anyio.create_task_group() as tg:

            async def stop_on_drain() -> None:
                await inst.stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(stop_on_drain)
            tg.start_soon(
                partial(
                    scheduler.run,
                    schedules,
                    SystemClock(),
                    state.schedule_waker,
                    listen=partial(asyncpg.connect, settings.database_url, timeout=5),
                )
            )

    def in_flight_by_queue() -> dict[str, int]:
        held: dict[str, int] = {}
        for claimed in list(inflight.values()):
            held[claimed.queue] = held.get(claimed.queue, 0) + 1
        return held

    async def maintain() -> None:
        with maintenance:
            async with anyio.create_task_group() as tg:
                tg.start_soon(end_grace_on_force)
                if settings.workers_enabled:
                    tg.start_soon(
                        partial(
                            heartbeat.run,
                            tasks,
                            inst.worker_id,
                            concurrency,
                            lease_seconds=settings.lease_seconds,
                            interval=settings.lease_seconds / 3,
                            is_draining=lambda: state.draining,
                            cancel=cancel_run,
                        )
                    )
                tg.start_soon(
                    partial(delayed_mover.run, tasks.redis, tasks.keys, queues, interval=settings.delayed_poll_seconds)
                )
                tg.start_soon(
                    partial(
                        reclaimer.run,
                        tasks,
                        lease_seconds=settings.lease_seconds,
                        interval=settings.reclaim_interval_seconds,
                    )
                )
                if settings.scheduler_enabled and settings.schedules and state.schedules is not None:
                    tg.start_soon(schedule, state.schedules)
                if tasks.metrics is not None:
                    tg.start_soon(
                        partial(
                            sampler.run,
                            tasks,
                            tasks.metrics,
                            queues,
                            interval=settings.metrics_sample_seconds,
                            in_flight=in_flight_by_queue,
                        )
                    )
                if settings.retention_seconds():
                    tg.start_soon(partial(retention.run, tasks, settings.retention_seconds()))
                tg.start_soon(
                    partial(
                        reconciler.run,
                        tasks,
                        queues,
                        instance=inst.worker_id,
                        sweep_interval=settings.reconcile_interval_seconds,
                    )
                )

    async with anyio.create_task_group() as services:
        committer_scope = anyio.CancelScope()

        committed = anyio.Event()

        async def commit() -> None:
            try:
                with committer_scope:
                    await committer.run(
                        results_recv,
                        tasks,
                        worker_id=inst.worker_id,
                        batch_size=settings.commit_batch_size,
                        flush_ms=settings.commit_flush_ms,
                    )
            finally:
                committed.set()

        services.start_soon(commit)
        services.start_soon(maintain)
        with grace:
            async with anyio.create_task_group() as workers:
                for queue in queues if settings.workers_enabled else []:
                    n = concurrency[queue]
                    # With prefetch, claimed tasks wait for an executor so that the next claim
                    # overlaps the current runs instead of following them (settings.prefetch).
                    prefetch = settings.prefetch_of(queue)
                    batch = min(n + prefetch, 100)
                    send, recv = anyio.create_memory_object_stream[ClaimedTask](n + prefetch)
                    slots = anyio.Semaphore(n + prefetch)
                    workers.start_soon(
                        partial(
                            fetcher.run,
                            queue,
                            tasks,
                            send,
                            slots,
                            inst.stop,
                            worker_id=inst.worker_id,
                            lease_seconds=settings.lease_seconds,
                            batch_max=batch,
                            batch_min=max(1, batch // 2),
                        )
                    )
                    for _ in range(n):
                        workers.start_soon(
                            partial(
                                executor.run,
                                recv.clone(),
                                results_send.clone(),
                                slots,
                                registry,
                                inflight,
                                cancels,
                                worker_id=inst.worker_id,
                                metrics=tasks.metrics,
                                log_payloads=settings.log_payloads,
                            )
                        )
                    buffers.append(recv)
                inst.ready.set()
                work = f"{total} executors on {', '.join(queues)}" if settings.workers_enabled else "no workers"
                notify.ready(f"ready: {work}; HTTP on port {inst.port}")
                log.info("instance_ready", worker_id=inst.worker_id)
                await inst.stop.wait()
                state.draining = True
                notify.stopping(f"draining {len(inflight)} runs, grace {settings.shutdown_grace_seconds:g} s")
                log.info("draining", in_flight=len(inflight), grace_s=settings.shutdown_grace_seconds)
                grace.deadline = anyio.current_time() + settings.shutdown_grace_seconds
                # The group now waits for fetchers to stop and executors to finish what they hold.
        # Runs unfinished after the grace period, and claimed tasks never started, go back.
        handed_back = list(inflight.values())
        for recv in buffers:
            while True:
                try:
                    handed_back.append(recv.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
            recv.close()
        with anyio.CancelScope(shield=True):
            for task in handed_back:
                await results_send.send(RunResult(task, Outcome.INTERRUPTED, error=INTERRUPTED_ERROR))
            if handed_back:
                log.warning("runs_handed_back", count=len(handed_back))
                for task in handed_back:
                    log.info("run_handed_back", **executor.log_keys(task, inst.worker_id))
            results_send.close()
            # The committer writes what it holds; bounded, so a dead store cannot hold the exit.
            committer_scope.deadline = anyio.current_time() + (1 if inst.force.is_set() else 5)
        with anyio.CancelScope(shield=True):
            await committed.wait()
        maintenance.cancel()
    with anyio.CancelScope(shield=True), anyio.move_on_after(2):
        try:
            if settings.workers_enabled:
                await tasks.deregister(inst.worker_id)
        except STORE_ERRORS as exc:
            log.warning("deregister_failed", error=str(exc))
