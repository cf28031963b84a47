"""Heartbeat: this instance's proof of life, and the leases of its running runs.

Every ``interval`` seconds (``lease_seconds / 3`` by default) one statement
upserts the instance's ``workers`` row (state ``running`` or ``draining``)
and pushes ``lease_expires_at`` of all its running runs to ``now +
lease_seconds``, so a live worker never loses a lease however long a task
runs. The same statement returns the running tasks whose cancellation was
requested; their handlers are cancelled through ``cancel``.

When PostgreSQL does not answer it logs once per outage and keeps trying;
leases then run out, and once the store is back the reclaimer may end runs
of this instance whose lease expired meanwhile (their late results are
dropped by the committer's fence).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable

import anyio
import structlog

from taskmesh import __version__
from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.tasks import Tasks

log = structlog.get_logger("taskmesh.heartbeat")


async def run_once(
    tasks: Tasks,
    worker_id: str,
    queues: dict[str, int],
    *,
    lease_seconds: float,
    draining: bool = False,
    cancel: Callable[[uuid.UUID], bool] | None = None,
) -> list[uuid.UUID]:
    """One beat; returns the ids of running tasks to cancel (and cancels them via ``cancel``)."""
    to_cancel = await tasks.heartbeat(
        worker_id,
        socket.gethostname(),
        os.getpid(),
        queues,
        __version__,
        "draining" if draining else "running",
        lease_seconds,
    )
    if tasks.metrics is not None:
        tasks.metrics.heartbeats.inc()
    if cancel is not None:
        for task_id in to_cancel:
            cancel(task_id)  # logs run_cancel_requested with the run's keys when it holds the run
    return to_cancel


async def run(
    tasks: Tasks,
    worker_id: str,
    queues: dict[str, int],
    *,
    lease_seconds: float,
    interval: float,
    is_draining: Callable[[], bool],
    cancel: Callable[[uuid.UUID], bool],
) -> None:
    """Beat forever (cancelled by the supervisor after deregistering)."""
    # Beat again soon after a store comes back, before any lease runs out.
    outage = Outage("heartbeat", max_delay=interval)
    while True:
        try:
            await run_once(tasks, worker_id, queues, lease_seconds=lease_seconds, draining=is_draining(), cancel=cancel)
        except STORE_ERRORS as exc:
            await outage.failed(exc)
            continue
        outage.recovered()
        await anyio.sleep(interval)
