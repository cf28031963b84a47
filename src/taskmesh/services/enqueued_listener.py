"""Pushes transactionally enqueued tasks into Redis as soon as their enqueuer commits.

``Client.enqueue(..., connection=conn)`` stores tasks inside the application's own
transaction and sends their ids on the PostgreSQL channel ``taskmesh_enqueued``
(:data:`taskmesh.tasks.tasks.ENQUEUED_CHANNEL`), which PostgreSQL delivers at commit and
never after a rollback. This service (``enqueued_listener``, optional, on every
instance) ``LISTEN``s on a connection of its own and pushes the ids it hears that
are still queued (one read, one pipeline per burst), within a second of the commit.
Ids announced while no instance listened (all down, the connection lost) are pushed
by the reconciler's sweep later.
"""

from __future__ import annotations

import uuid

import anyio

from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.services.base import Outage
from taskmesh.store.postgres import Listener
from taskmesh.tasks.tasks import ENQUEUED_CHANNEL, Tasks

log = get_logger("taskmesh.enqueued_listener")

BURST_SECONDS = 1.0
"""Longest the service waits between two looks at what it heard (it wakes at once on a notification)."""


class Heard:
    """Task ids heard on the channel and not pushed yet, and the event that wakes the service."""

    def __init__(self) -> None:
        self.ids: set[uuid.UUID] = set()
        self.wake = anyio.Event()

    def __call__(self, payload: str) -> None:
        """The listener's callback: collect the ids (a lost connection only wakes the service)."""
        if payload != Listener.LOST:
            for raw in payload.split():
                try:
                    self.ids.add(uuid.UUID(raw))
                except ValueError:
                    log.warning("enqueued_payload_invalid", payload=raw[:64])
        self.wake.set()

    def take(self) -> list[uuid.UUID]:
        """The ids heard so far (forgotten here), and a fresh event."""
        ids, self.ids = list(self.ids), set()
        self.wake = anyio.Event()
        return ids


async def run_once(tasks: Tasks, heard: Heard) -> int:
    """Push what was heard; returns how many tasks were pushed.

    :raises StoreError: a store failed (the ids are kept for the next try).
    """
    ids = heard.take()
    if not ids:
        return 0
    try:
        return await tasks.push_enqueued(ids)
    except StoreError:
        heard.ids.update(ids)
        raise


async def run(database_url: str, tasks: Tasks) -> None:
    """Listen and push for ever (cancelled by the supervisor)."""
    heard = Heard()
    listener = Listener(database_url, ENQUEUED_CHANNEL, heard)
    outage = Outage("enqueued_listener")
    try:
        while True:
            try:
                await listener.ensure()
                pushed = await run_once(tasks, heard)
                outage.recovered()
            except StoreError as exc:
                if not exc.transient:
                    log.error("enqueued_listener_failed", operation=exc.operation, error=str(exc))
                await outage.failed(exc)
                continue
            if pushed:
                log.debug("enqueued_pushed", tasks=pushed)
            with anyio.move_on_after(BURST_SECONDS):
                await heard.wake.wait()
    finally:
        with anyio.CancelScope(shield=True):
            await listener.close()
