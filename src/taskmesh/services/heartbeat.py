"""Heartbeat: this instance's proof of life, and the leases of the runs it holds.

Every ``interval`` seconds (``lease_seconds / 3``) one statement upserts the
instance's ``workers`` row (state ``running`` or ``draining``) and pushes
``lease_expires_at`` to ``now + lease_seconds`` for exactly the runs the
instance holds (``held()``: those in its executors, claimed and waiting in
its channels, and finished but not yet written by its committer). A live
instance thus never loses a lease however long a task runs, and a run it no
longer holds (lost to a bug) is not kept alive: its lease expires and the
reclaimer retries it. The same statement returns held runs whose task's
cancellation was requested; their handlers are cancelled through ``cancel``.

When PostgreSQL does not answer it logs once per outage and keeps trying
(backoff capped at the interval, so the first beat after an outage comes
soon); leases then run out, and once the store is back the reclaimer may end
runs of this instance whose lease expired meanwhile (their late results are
dropped by the committer's fence). Critical: if it keeps crashing, the
instance shuts down rather than let its leases lapse.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Collection

import orjson

from taskmesh import __version__
from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import Metrics
from taskmesh.services.base import Counts, run_periodic
from taskmesh.store import PgStore
from taskmesh.tasks.states import WorkerState

log = get_logger("taskmesh.heartbeat")


async def run_once(
    pg: PgStore,
    worker_id: str,
    queues: dict[str, int],
    *,
    lease_seconds: float,
    held: Collection[uuid.UUID] = (),
    draining: bool = False,
    cancel: Callable[[uuid.UUID], bool] | None = None,
    metrics: Metrics | None = None,
    handlers: Collection[str] | None = None,
    handler_options: str | None = None,
) -> list[uuid.UUID]:
    """One beat; returns the ids of held tasks to cancel (and cancels them via ``cancel``).

    :param held: run ids whose leases to extend.
    :param handlers: the task names this instance has handlers for (``None``: any, a fallback).
    :param handler_options: what it advertises of its registered handlers (JSON,
        :func:`~taskmesh.tasks.advertised.handler_options`).
    :raises StoreError: PostgreSQL failed.
    """
    to_cancel = await pg.workers.heartbeat(
        worker_id,
        socket.gethostname(),
        os.getpid(),
        orjson.dumps(queues).decode(),
        __version__,
        WorkerState.DRAINING if draining else WorkerState.RUNNING,
        lease_seconds,
        list(held),
        None if handlers is None else sorted(handlers),
        handler_options,
    )
    if metrics is not None:
        metrics.heartbeats.inc()
    if cancel is not None:
        for task_id in to_cancel:
            cancel(task_id)  # logs run_cancel_requested with the run's keys when it holds the run
    return to_cancel


async def run(
    pg: PgStore,
    worker_id: str,
    queues: dict[str, int],
    *,
    lease_seconds: float,
    interval: float,
    held: Callable[[], Collection[uuid.UUID]],
    is_draining: Callable[[], bool],
    cancel: Callable[[uuid.UUID], bool],
    metrics: Metrics | None = None,
    handlers: Collection[str] | None = None,
    handler_options: str | None = None,
    hold_slots: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Beat for ever (cancelled by the supervisor after deregistering); ``handlers`` and
    ``handler_options`` as :func:`run_once`.

    :param hold_slots: after each beat, keeps the limit slots of the held runs as long as their leases
        (``RedisLimits.hold``); a Redis failure there is logged, and the beat stands.
    """

    async def beat() -> Counts:
        await run_once(
            pg,
            worker_id,
            queues,
            lease_seconds=lease_seconds,
            held=held(),
            draining=is_draining(),
            cancel=cancel,
            metrics=metrics,
            handlers=handlers,
            handler_options=handler_options,
        )
        if hold_slots is not None:
            try:
                await hold_slots()
            except StoreError as exc:  # the slots lapse with the leases unless a later beat holds them
                log.warning("limit_slots_not_held", error=str(exc))
        return {}

    await run_periodic("heartbeat", beat, interval=interval, first_delay=interval, max_backoff=interval)
