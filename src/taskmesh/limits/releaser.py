"""Slots given back when a run ends, not when its result is written.

A limit's slot frees the moment its run's handler returns: the next task of the key may start while
the committer still gathers the result into its batch (up to ``commit_interval_ms``) and writes it.
Executors hand the ended runs here; one call of ``lua/limits_release.lua`` gives back every slot
that ended since the last one, fenced by the lease end this instance last gave each slot (see
``Release.fence``). The result's own write then forgets the task's keys and sets a ``RateLimited``
back-off (``Tasks.mirror``); a run that asked for a back-off keeps its slot until then, so that no
task of its key starts in between. A failed call is logged; the write's release, or the lease,
frees the slots.

It also renames the slots an executor handed to a task claimed ahead (``limits/standby.py``), before
the releases of the same call, and, in a call that handed nothing over, starts the tasks claimed ahead
whose key has room.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio

from taskmesh.errors import StoreError
from taskmesh.limits.book import LimitBook
from taskmesh.limits.standby import Standbys
from taskmesh.observability.logs import get_logger
from taskmesh.store.redis_limits import Handoff, RedisLimits, Release
from taskmesh.tasks.models import ClaimedTask

log = get_logger("taskmesh.limits")


class SlotReleaser:
    """The slots of one queue's runs held by this instance (see module docs).

    :param queue: the queue.
    :param limits: where slots are given back.
    :param book: the limits in force (the numbers the freed keys' parked ids are moved back by).
    :param standbys: the queue's tasks claimed ahead of a full key.
    :param start: hands tasks claimed ahead that took a slot to the executors.
    :param lease_seconds: how long a slot handed or taken holds unless a heartbeat extends it.
    :param stopping: whether the instance drains (then tasks claimed ahead wait to be handed back).
    """

    def __init__(
        self,
        queue: str,
        limits: RedisLimits,
        book: LimitBook,
        *,
        standbys: Standbys | None = None,
        start: Callable[[list[ClaimedTask]], None] = lambda _tasks: None,
        lease_seconds: float = 30.0,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.queue = queue
        self.limits = limits
        self.book = book
        self.standbys = standbys or Standbys()
        self.start = start
        self.stopping = stopping
        self.lease_ms = round(lease_seconds * 1000)
        self._handed: list[Handoff] = []
        self.until: dict[uuid.UUID, int] = {}
        """Each held run's slots' lease end as this instance last set it, by task id (the fence)."""
        self._ended: list[Release] = []
        self._wake = anyio.Event()

    def held(self, task_id: uuid.UUID, until_ms: int) -> None:
        """The slots of ``task_id``'s run now hold until ``until_ms`` (its admission, a heartbeat)."""
        self.until[task_id] = until_ms

    def extend(self, task_ids: list[uuid.UUID], until_ms: int) -> None:
        """The heartbeat moved these runs' slots' lease end to ``until_ms`` (a run that ended meanwhile stays out)."""
        for task_id in task_ids:
            if task_id in self.until:
                self.until[task_id] = until_ms

    def ended(self, task_id: uuid.UUID, limit_keys: list[str] | None) -> None:
        """The run of ``task_id`` ended: give its slots back at the next call."""
        until = self.until.pop(task_id, None)
        keys = list(limit_keys or ())
        if until is None or not keys:
            return
        self._ended.append(Release(str(task_id), keys, fence=until))
        self._wake.set()

    def handed(self, ended: uuid.UUID, key: str, task_id: uuid.UUID) -> None:
        """The slot of ``key`` that the run of ``ended`` held now belongs to the run of ``task_id``, which
        starts now; renamed at the next call (the new run's own release, if it ends first, is unfenced)."""
        fence = self.until.pop(ended, 0)
        self.until[task_id] = 0
        self._handed.append(Handoff(key, str(ended), fence, str(task_id)))
        self._wake.set()

    def forget(self, task_id: uuid.UUID) -> None:
        """The run's slots are left to its result's write (a ``RateLimited`` back-off): no early release."""
        self.until.pop(task_id, None)

    def pending(self) -> bool:
        """Whether runs ended (or slots were handed over) since the last call."""
        return bool(self._ended or self._handed)

    async def flush(self) -> None:
        """Rename the slots handed over since the last call, or start the tasks claimed ahead whose key has
        room; then give back every slot that ended (a script call each, when there is something to do)."""
        handed, self._handed = self._handed, []
        waiting = [] if handed or self.stopping() else self.standbys.waiting()
        if handed or waiting:
            await self._hand_over(handed, waiting)
        given, self._ended = self._ended, []
        if not given:
            return
        try:
            await self.limits.release(
                self.queue,
                given,
                self.book.script_args(),
                fair=self.book.fair_args(self.queue),
            )
        except StoreError as exc:
            log.warning("limit_release_failed", queue=self.queue, runs=len(given), error=str(exc))

    async def run(self, done: anyio.Event) -> None:
        """Give slots back as runs end until ``done`` is set, then once more."""
        while not done.is_set():
            with anyio.move_on_after(0.5):
                await self._wake.wait()
            self._wake = anyio.Event()
            await self.flush()
        await self.flush()

    async def _hand_over(self, handed: list[Handoff], waiting: list[tuple[str, str]]) -> None:
        """One call of ``lua/limits_standby.lua``; a failure is logged (the handed slots stay the ended runs'
        until their leases end, or their results' writes give them back)."""
        try:
            done = await self.limits.hand_over(self.queue, handed, waiting, self.book.script_args(), self.lease_ms)
        except StoreError as exc:
            log.warning("limit_hand_over_failed", queue=self.queue, runs=len(handed), error=str(exc))
            return
        for h in handed:
            task_id = uuid.UUID(h.task_id)
            if task_id in self.until:
                self.until[task_id] = done.until_ms
        now = self.limits.now_ms()
        for key, until in done.backing_off.items():
            self.standbys.back_off(key, max(0, until - now) / 1000)
        for key, stopped in done.stop.items():
            self.standbys.stop(key, stopped)
        if done.started:
            started = self.standbys.take({uuid.UUID(i) for i in done.started})
            for task in started:
                self.until[task.task_id] = done.until_ms
            self.start(started)
