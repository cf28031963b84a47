"""One queue's workers: a fetcher, ``concurrency`` executors, and the slots between them.

The **fetcher** pops ready ids from ``{prefix}:{q}:ready`` (``BZMPOP``, as many
as slots are free), admits them under the task limits in force when any may hold a task of
the queue (``RedisLimits.admit``, one script call: ids that may not start yet are parked out of
the ready set, and come back when their limit key has room), claims them in PostgreSQL with one conditional UPDATE, and
puts each :class:`~taskmesh.tasks.models.ClaimedTask` on the queue's channel; ids
whose claim fails (already claimed, not queued) are dropped quietly, ids not
due yet go back to the delayed set. It stops at the top of its loop once
``stop`` is set (within ``pop_timeout`` seconds).

A **paused** queue (a row in ``queues``) is refused by the claim
statement itself, on every instance, from the pause's commit on; its popped
ids go back to the ready set. A pop whose ids were all refused makes the
fetcher ask PostgreSQL whether the queue is paused; while it is, the fetcher
pops nothing and asks again every ``RESUME_POLL_SECONDS`` (logs
``queue_pause_seen`` and ``queue_resume_seen``). A running queue costs no
read at all; a paused one, one primary-key read per 0.5 s per instance. It is a supervised service
(``fetcher:<queue>``, critical): a bug in it restarts it, never the executors.

The **executors** (``concurrency`` of them) take tasks from the channel, run
them (``executor.run_one``: never raises) and submit each result to the
committer. **Slots** bound what the queue holds: ``concurrency + prefetch``;
the fetcher takes one per claimed task and an executor gives it back when it
submitted the result. With prefetch, claimed tasks wait for an executor so
that the next claim overlaps the current runs.

Everything claimed and not yet submitted is in :attr:`QueueWorkers.claimed`:
the heartbeat keeps those leases, and at shutdown, once the executors have
drained (or the grace period cut them off), what is left there is handed back
(:meth:`QueueWorkers.unfinished`). Store failures are handled by the fetcher
(log once, back off, go on); popped ids that were not claimed stay queued in
PostgreSQL and are pushed again by the reconciler.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import anyio

from taskmesh.errors import StoreError
from taskmesh.limits.book import limit_name
from taskmesh.limits.releaser import SlotReleaser
from taskmesh.limits.standby import Standbys, standby_key
from taskmesh.observability.logs import get_logger, run_keys
from taskmesh.observability.metrics import Metrics
from taskmesh.services.base import Outage
from taskmesh.services.committer import Committer
from taskmesh.services.executor import debug_enabled, run_one
from taskmesh.services.run_tally import RunTally
from taskmesh.services.sync_handlers import SyncHandlers
from taskmesh.tasks.models import ClaimedTask
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks

log = get_logger("taskmesh.worker_pool")

BATCH_MAX = 100
"""Most ids popped and claimed at once."""
GATHER_SECONDS = 0.002
GATHER_MAX_SECONDS = 0.1
"""Longest the fetcher gathers free slots while the executors still have claimed tasks waiting."""
POP_TIMEOUT_SECONDS = 1.0
RESUME_POLL_SECONDS = 0.5
"""How often a fetcher of a paused queue asks whether it was resumed."""


class QueueWorkers:
    """The fetcher and executors of one queue (see module docs).

    :param concurrency: executors (handlers running at once).
    :param prefetch: tasks claimed ahead of free executors.
    :param stop: set by the supervisor when the instance drains.
    :param now: PostgreSQL's time in epoch seconds (``StoreClock.timestamp``), for the queue wait.
    :param tally: where ended runs are counted for ``queue_minutes`` (the sampler writes them).
    """

    def __init__(
        self,
        queue: str,
        *,
        tasks: Tasks,
        registry: Registry,
        committer: Committer,
        worker_id: str,
        concurrency: int,
        prefetch: int,
        lease_seconds: float,
        stop: anyio.Event,
        metrics: Metrics | None = None,
        log_payloads: bool = False,
        sync: SyncHandlers | None = None,
        now: Callable[[], float] = time.time,
        tally: RunTally | None = None,
    ) -> None:
        self.queue = queue
        self.tasks = tasks
        self.registry = registry
        self.committer = committer
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.stop = stop
        self.metrics = metrics
        self.log_payloads = log_payloads
        self.sync = sync or SyncHandlers(None, default="thread", worker_id=worker_id)
        self.tally = tally
        self.now = now
        capacity = concurrency + prefetch
        self.batch_max = min(capacity, BATCH_MAX)
        self.batch_min = max(1, self.batch_max // 2)
        self._send, self._receive = anyio.create_memory_object_stream[ClaimedTask](capacity)
        self.slots = anyio.Semaphore(capacity)
        self.claimed: dict[uuid.UUID, ClaimedTask] = {}
        """Runs claimed and not yet submitted to the committer, by run id (held: leases kept)."""
        self.started: set[uuid.UUID] = set()
        """Run ids whose handler started."""
        self.cancels: dict[uuid.UUID, anyio.CancelScope] = {}
        self.paused = False
        """Whether the queue was paused when the fetcher last asked (it then pops nothing)."""
        self.popped: set[str] = set()
        """Ids popped from Redis whose claim has not answered yet (``reconciler.Popped``)."""
        self._outage = Outage(f"fetcher:{queue}")
        self.prefetch = prefetch
        self.standbys = Standbys()
        """Tasks claimed ahead of a full limit key (``limits/standby.py``): they hold slots of ``slots``."""
        self.releaser = SlotReleaser(
            queue,
            tasks.redis.limits,
            tasks.limits,
            standbys=self.standbys,
            start=self._start_standbys,
            lease_seconds=lease_seconds,
            stopping=stop.is_set,
        )
        """Gives the limit slots of ended runs back as they end (``limits/releaser.py``)."""

    # -- the fetcher -------------------------------------------------------------

    async def fetch(self) -> None:
        """Claim and hand on tasks until ``stop`` is set (the supervised service)."""
        while not self.stop.is_set():
            if self.paused:
                await self._wait_for_resume()
                continue
            await self.slots.acquire()
            taken = 1 + await self._gather_slots(self.batch_max - 1, self.batch_min - 1)
            if self.stop.is_set():  # shutdown began while waiting for slots: claim nothing more
                for _ in range(taken):
                    self.slots.release()
                break
            try:
                claimed, stood_by = await self._fetch_batch(taken)
            except StoreError as exc:
                for _ in range(taken):
                    self.slots.release()
                if not exc.transient:
                    log.error("fetch_failed", queue=self.queue, operation=exc.operation, error=str(exc))
                    await anyio.sleep(1)
                else:
                    await self._outage.failed(exc)
                continue
            except BaseException:
                for _ in range(taken):
                    self.slots.release()
                raise
            self._outage.recovered()
            for _ in range(taken - len(claimed) - stood_by):
                self.slots.release()
            for item in claimed:
                self.claimed[item.run_id] = item
                # Each claimed task holds a slot and the buffer has one place per slot, so
                # this never waits; no checkpoint (a round through the event loop) per task.
                try:
                    self._send.send_nowait(item)
                except anyio.WouldBlock:
                    await self._send.send(item)

    async def fetch_once(self, count: int) -> list[ClaimedTask]:
        """Pop up to ``count`` ids, admit them under the task limits in force, and claim those admitted;
        returns the claimed tasks that may run (those claimed ahead of a full limit key wait in
        ``standbys``, each holding one of ``count``).

        :raises StoreError: a store failed.
        """
        claimed, _ = await self._fetch_batch(count)
        return claimed

    async def _fetch_batch(self, count: int) -> tuple[list[ClaimedTask], int]:
        """:meth:`fetch_once`, and how many tasks were claimed ahead into ``standbys``."""
        ids, scores = await self.tasks.redis.pop_with_scores(self.queue, count, POP_TIMEOUT_SECONDS)
        if not ids:
            return [], 0
        limits = self.tasks.limits  # as it is now: a limit set while the pop waited holds what it popped
        if not limits.applies_in(self.queue):  # the common case: no admission, no extra call, no score read
            return await self._claim(ids), 0
        popped = [(task_id, float(score)) for task_id, score in zip(ids, scores, strict=True)]
        self.popped.update(ids)
        try:
            if self.releaser.pending():  # runs that just ended free their slots first: the admission counts them
                await self.releaser.flush()
            admission = await self.tasks.redis.limits.admit(
                self.queue,
                popped,
                limits.script_args(),
                round(self.lease_seconds * 1000),
                fair=limits.fair_args(self.queue),
                batch=self.batch_max,
                step=limits.priority_step(self.queue),
                ahead=max(0, self.prefetch - self.standbys.total),
                depth=self.prefetch / self.concurrency,
                standing=self.standbys.counts(),
            )
        finally:
            self.popped.difference_update(ids)
        if admission.parked and self.metrics is not None:
            self.metrics.limit_parked(admission.parked)
        if not admission.started and not admission.standby:
            return [], 0
        ahead = dict(admission.standby)
        claimed = await self._claim([i for i, _ in admission.started] + list(ahead), dict(admission.started))
        runnable: list[ClaimedTask] = []
        for task in claimed:
            key = ahead.get(str(task.task_id))
            if key is not None:
                self.claimed[task.run_id] = task  # its lease kept by the heartbeat while it waits
                self.standbys.add(task, key)
                continue
            if task.limit_keys:
                self.releaser.held(task.task_id, admission.until_ms)
            runnable.append(task)
        await self._count_unseen_slots(runnable, dict(admission.started))
        return runnable, len(claimed) - len(runnable)

    def _start_standbys(self, tasks: list[ClaimedTask]) -> None:
        """Hand tasks claimed ahead that now hold their slot to the executors (each holds a slot of
        ``slots`` already, so the channel has room); after the fetcher stopped they stay claimed and are
        handed back with the others (:meth:`unfinished`)."""
        for task in tasks:
            try:
                self._send.send_nowait(task)
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                log.warning("standby_not_started", queue=self.queue, task_id=str(task.task_id))

    async def _claim(self, ids: list[str], slots: dict[str, list[str]] | None = None) -> list[ClaimedTask]:
        """Claim popped (and admitted) ids; ``slots``: the limit keys each holds a slot of."""
        # Between the pop and the claim's answer these ids are in neither Redis nor (as
        # claimed) PostgreSQL; the reconciler adds them to Redis's count (reconciler.Popped).
        self.popped.update(ids)
        try:
            claimed = await self.tasks.claim(self.queue, ids, self.worker_id, self.lease_seconds, slots)
        finally:
            self.popped.difference_update(ids)
        if not claimed:  # every id refused: claimed elsewhere, or the queue was paused
            await self._read_pause()
        return claimed

    async def _count_unseen_slots(self, claimed: list[ClaimedTask], slots: dict[str, list[str]]) -> None:
        """Give slots to claimed runs whose limit keys Redis did not know when it admitted them.

        Every push writes an id's limit keys beside it, so this is a repair: keys lost with Redis's data
        before the reconciler rebuilt them. The run was started without its limits' say; from here on
        it counts against them (logged ``limit_keys_unseen``).
        """
        unseen = [(t.task_id, t.limit_keys) for t in claimed if t.limit_keys and not slots.get(str(t.task_id))]
        if not unseen:
            return
        log.warning("limit_keys_unseen", queue=self.queue, tasks=len(unseen))
        until = self.tasks.redis.now_ms() + round(self.lease_seconds * 1000)
        await self.tasks.redis.limits.restore(self.queue, [(i, k, until) for i, k in unseen if k])
        for task_id, _ in unseen:
            self.releaser.held(task_id, until)

    async def _read_pause(self) -> None:
        """Ask PostgreSQL whether the queue is paused; log when that changed.

        :raises StoreError: PostgreSQL failed (the last answer stands).
        """
        row = await self.tasks.pg.queues.get_pause(self.queue)
        paused = row is not None and row["paused_at"] is not None
        if paused != self.paused:
            log.info("queue_pause_seen" if paused else "queue_resume_seen", queue=self.queue)
        self.paused = paused

    async def _wait_for_resume(self) -> None:
        """Wait ``RESUME_POLL_SECONDS`` (less when ``stop`` is set), then ask whether the queue resumed."""
        with anyio.move_on_after(RESUME_POLL_SECONDS):
            await self.stop.wait()
        if self.stop.is_set():
            return
        try:
            await self._read_pause()
        except StoreError as exc:
            if exc.transient:
                await self._outage.failed(exc)
            else:
                log.error("fetch_failed", queue=self.queue, operation=exc.operation, error=str(exc))
            return
        self._outage.recovered()

    async def _gather_slots(self, most: int, enough: int) -> int:
        """Take up to ``most`` more free slots, waiting while fewer than ``enough``.

        Under load executors free up one by one; waiting a moment for a few more
        turns one claim per task into one claim per batch (docs/internals/design.md principle 6).
        An idle queue's slots are all free at once, so no wait happens there. The
        wait is up to :data:`GATHER_SECONDS`, and longer (up to
        :data:`GATHER_MAX_SECONDS`) while the channel still holds a claimed task for
        every executor: no executor can run short, and a queue that finishes a few
        hundred tasks a second then claims a batch every few tens of milliseconds,
        not one task per claim (each claim is a commit).
        """
        taken = 0
        while taken < most:
            try:
                self.slots.acquire_nowait()
            except anyio.WouldBlock:
                break
            taken += 1
        if taken >= enough:
            return taken
        with anyio.move_on_after(GATHER_SECONDS):
            while taken < enough:
                await self.slots.acquire()
                taken += 1
        if taken < enough and self.waiting() >= self.concurrency:
            with anyio.move_on_after(GATHER_MAX_SECONDS - GATHER_SECONDS):
                # An executor frees a slot and takes the next task in one step: checked after each.
                while taken < enough and self.waiting() >= self.concurrency:
                    await self.slots.acquire()
                    taken += 1
        return taken

    def waiting(self) -> int:
        """Claimed tasks in the channel that no executor took yet."""
        return self._send.statistics().current_buffer_used

    def close_fetching(self) -> None:
        """The fetcher has stopped: executors finish what the channel holds, then return."""
        self._send.close()

    # -- the executors -----------------------------------------------------------

    async def execute(self) -> None:
        """Run ``concurrency`` executors until the channel is closed and drained, and the slot releaser beside
        them (until they are done)."""
        done = anyio.Event()
        async with anyio.create_task_group() as outer:
            outer.start_soon(self.releaser.run, done)
            try:
                async with anyio.create_task_group() as tg:
                    for _ in range(self.concurrency):
                        tg.start_soon(self._executor)
            finally:
                done.set()

    async def _executor(self) -> None:
        debug = debug_enabled()
        receive = self._receive.clone()
        async with receive:
            while True:
                # Take a buffered task without a checkpoint (a round through the event loop per
                # task); wait only when the buffer is empty. The handler's own awaits yield.
                try:
                    task = receive.receive_nowait()
                except anyio.WouldBlock:
                    try:
                        task = await receive.receive()
                    except anyio.EndOfStream:
                        return
                except anyio.EndOfStream:
                    return
                self.started.add(task.run_id)
                if task.limit_keys:
                    self.standbys.run_started(task)
                if self.tally is not None and task.ready_at is not None:
                    self.tally.waited(task.queue, max(0.0, self.now() - task.ready_at))
                result = await run_one(
                    task,
                    registry=self.registry,
                    cancels=self.cancels,
                    sync=self.sync,
                    worker_id=self.worker_id,
                    metrics=self.metrics,
                    debug=debug,
                    log_payloads=self.log_payloads,
                    now=self.now,
                    advertised=self.tasks.advertised_handler if self.registry.fallback is not None else None,
                )
                if task.limit_keys:  # the slots free as the run ends, not when its result is written
                    self._slot_freed(task, result.back_off_seconds)
                    self.standbys.run_ended(task)
                await self.committer.submit(result)
                if self.tally is not None:
                    self.tally.add(task.queue, result.outcome)
                self.claimed.pop(task.run_id, None)
                self.started.discard(task.run_id)
                self.slots.release()

    def _slot_freed(self, task: ClaimedTask, back_off_seconds: float | None) -> None:
        """The run of ``task`` ended: its slots go to a task claimed ahead of its key if one waits here
        (started at once), else back to Redis; a ``RateLimited`` run's stay until its result's write."""
        if back_off_seconds:
            self.releaser.forget(task.task_id)
            for key in task.limit_keys or ():
                self.standbys.back_off(key, back_off_seconds)
            return
        handed = None if self.stop.is_set() or not self._may_hand_over(task) else self.standbys.next_for(task)
        if handed is None:
            self.releaser.ended(task.task_id, task.limit_keys)
            return
        key, standby = handed
        self.releaser.handed(task.task_id, key, standby.task_id)
        self._start_standbys([standby])

    def _may_hand_over(self, ended: ClaimedTask) -> bool:
        """Whether the slot of ``ended``'s run may go to a task claimed ahead here: not while draining (they
        are handed back), nor when its limit, as this instance holds it now, is gone, has a rate, or is lower
        than this instance's own runs of the key (a limit lowered at run time; the releaser's next call
        says so of the key's runs on every instance)."""
        key = standby_key(ended.limit_keys)
        if key is None or self.stop.is_set():
            return False
        settings = self.tasks.limits.limits.get(limit_name(key))
        if settings is None or settings.concurrency is None or settings.rate is not None:
            return False
        return self.standbys.running(key) <= settings.concurrency

    # -- shutdown and control ----------------------------------------------------

    def unfinished(self) -> list[ClaimedTask]:
        """Runs claimed and not submitted (to hand back at shutdown); empties the channel."""
        while True:
            try:
                self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        self._receive.close()
        left = list(self.claimed.values())
        self.claimed.clear()
        self.standbys.clear()
        return left

    def release(self) -> None:
        """Close both ends of the channel: the instance is done with this queue's workers.

        For the owner once the fetcher and the executors have returned for good, or never ran
        (the channel's streams warn when collected open). Calling it again does nothing.
        """
        self._send.close()
        self._receive.close()

    def cancel(self, task_id: uuid.UUID) -> bool:
        """Cancel the running handler of ``task_id`` if this queue holds it; returns whether it did."""
        scope = self.cancels.get(task_id)
        if scope is None:
            return False
        scope.cancel()
        held = next((t for t in self.claimed.values() if t.task_id == task_id), None)
        if held is not None:
            log.info("run_cancel_requested", **run_keys(held, self.worker_id))
        return True

    def in_flight(self) -> int:
        """Handlers running now."""
        return len(self.started)
