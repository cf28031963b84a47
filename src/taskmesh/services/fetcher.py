"""Fetcher of one queue: pops ready ids from Redis, claims them in PostgreSQL, hands them on.

Reads ``{prefix}:{q}:ready`` (``BZMPOP``, as many ids as executors are free),
claims them with one conditional UPDATE (queued -> running, a run row per
claim) and sends each :class:`~taskmesh.models.ClaimedTask` to the queue's
executors. Ids whose claim fails (already claimed, not queued) are dropped
quietly. When a store fails it logs once, backs off and goes on; ids popped
but not claimed stay queued in PostgreSQL and are pushed again by the
re-push service.

Stops at the top of its loop once ``stop`` is set (within ``pop_timeout``
seconds), closing its send stream so that executors finish what is buffered.
"""

from __future__ import annotations

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from taskmesh.models import ClaimedTask
from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.store import redis as rstore
from taskmesh.tasks import Tasks


async def run(
    queue: str,
    tasks: Tasks,
    send: MemoryObjectSendStream[ClaimedTask],
    slots: anyio.Semaphore,
    stop: anyio.Event,
    *,
    worker_id: str,
    lease_seconds: float,
    batch_max: int = 100,
    batch_min: int = 1,
    gather_seconds: float = 0.002,
    pop_timeout: float = 1.0,
) -> None:
    """Fetch until ``stop`` is set.

    :param slots: free executor slots; the fetcher takes one per claimed task
        and the executor gives it back when the run's result is sent.
    :param batch_max: most ids popped and claimed at once.
    :param batch_min: free slots worth a short wait (``gather_seconds``, default
        2 ms) before popping, when fewer are free.
    :param pop_timeout: seconds a ``BZMPOP`` blocks on an empty queue.
    """
    outage = Outage(f"fetcher:{queue}")
    async with send:
        while not stop.is_set():
            await slots.acquire()
            if stop.is_set():  # waited for a free executor while shutdown began
                slots.release()
                break
            taken = 1 + await _gather_slots(slots, batch_max - 1, batch_min - 1, gather_seconds)
            try:
                claimed = await run_once(queue, tasks, taken, worker_id, lease_seconds, pop_timeout)
            except STORE_ERRORS as exc:
                for _ in range(taken):
                    slots.release()
                await outage.failed(exc)
                continue
            outage.recovered()
            for _ in range(taken - len(claimed)):
                slots.release()
            for item in claimed:
                # Each claimed task holds a slot and the buffer has one place per slot, so
                # this never waits; no checkpoint (a round through the event loop) per task.
                try:
                    send.send_nowait(item)
                except anyio.WouldBlock:
                    await send.send(item)


async def _gather_slots(slots: anyio.Semaphore, most: int, enough: int, wait: float) -> int:
    """Take up to ``most`` more free slots; wait up to ``wait`` seconds while fewer than ``enough``.

    Under load executors free up one by one; waiting a moment for a few more
    turns one claim per task into one claim per batch (design.md principle 6).
    An idle queue's slots are all free at once, so no wait happens there.
    """
    taken = 0
    while taken < most:
        try:
            slots.acquire_nowait()
        except anyio.WouldBlock:
            break
        taken += 1
    if taken < enough and wait > 0:
        with anyio.move_on_after(wait):
            while taken < enough:
                await slots.acquire()
                taken += 1
    return taken


async def run_once(
    queue: str, tasks: Tasks, count: int, worker_id: str, lease_seconds: float, pop_timeout: float
) -> list[ClaimedTask]:
    """Pop up to ``count`` ids and claim them; returns the claimed tasks."""
    ids = await rstore.pop_ready(tasks.redis, tasks.keys, queue, count, pop_timeout)
    if not ids:
        return []
    return await tasks.claim(queue, ids, worker_id, lease_seconds)
