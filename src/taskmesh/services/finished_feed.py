"""Requests waiting for a task to finish (``GET /api/v1/tasks/{id}?wait=N``), and the subscription that wakes them.

The service (``finished_feed``, optional, on instances that serve the API) holds one
subscription to the channel of finished task ids (:mod:`taskmesh.store.finished`) and
wakes the local waiters of each id it hears. Whenever the subscription starts (at
start-up and after a Redis outage) it wakes every waiter, so that an end announced
while nobody listened is read from PostgreSQL. While it is not subscribed,
:attr:`FinishedWaiters.live` is false and waiters read the task once a second instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import anyio

from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.services.base import Outage
from taskmesh.store import RedisStore

log = get_logger("taskmesh.finished_feed")


class Waiter:
    """One waiting request: :attr:`event` is set when its task may have finished."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def rearm(self) -> None:
        """A fresh event, after a wake that did not find the task finished."""
        self.event = anyio.Event()


class FinishedWaiters:
    """The instance's waiting requests by task id, and whether the subscription hears announcements."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[Waiter]] = {}
        self.live = False

    @contextmanager
    def waiting(self, task_id: str) -> Iterator[Waiter]:
        """Register a waiter for ``task_id`` for the duration of the block."""
        waiter = Waiter()
        self._waiters.setdefault(task_id, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(task_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[task_id]

    def wake(self, task_ids: Iterable[str]) -> None:
        """Wake the waiters of ``task_ids``."""
        for task_id in task_ids:
            for waiter in self._waiters.get(task_id, ()):
                waiter.event.set()

    def wake_all(self) -> None:
        """Wake every waiter (each reads its task again)."""
        self.wake(list(self._waiters))


async def run(redis: RedisStore, waiters: FinishedWaiters) -> None:
    """Hold the subscription for ever, waking waiters (cancelled by the supervisor)."""
    outage = Outage("finished_feed")
    while True:
        try:
            async with redis.finished.subscribe() as subscription:
                waiters.live = True
                outage.recovered()
                waiters.wake_all()
                while True:
                    task_ids = await subscription.receive()
                    if task_ids:
                        waiters.wake(task_ids)
        except StoreError as exc:
            waiters.live = False
            waiters.wake_all()  # they read once a second until the subscription is back
            if exc.transient:
                await outage.failed(exc)
            else:
                log.error("finished_feed_failed", error=str(exc))
                await anyio.sleep(1)
        finally:
            waiters.live = False
