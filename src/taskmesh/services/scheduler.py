"""Scheduler: fires cron schedules (design.md section 5, issue 5).

It syncs the instance's ``[[schedules]]`` into PostgreSQL, then loops: fire
what is due (:meth:`taskmesh.schedules.Schedules.fire_due`), read the earliest
next fire, and sleep until that instant, never more than ``max_sleep``
seconds (a schedule resumed through another instance is seen by then) and
less when woken: by this instance's API (pause, resume, trigger) or by a
PostgreSQL ``NOTIFY`` from any instance. No polling tick, no drift: every
sleep is to an absolute instant read from the clock.

Safe in every instance at once (row locks and idempotency keys, see
``schedules.py``). Store failures are logged once per outage, with backoff.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import structlog

from taskmesh.clock import Clock, Waker
from taskmesh.schedules import NOTIFY_CHANNEL, Schedules
from taskmesh.services.outage import STORE_ERRORS, Outage

log = structlog.get_logger("taskmesh.scheduler")


async def run(schedules: Schedules, clock: Clock, waker: Waker, *, max_sleep: float = 60.0) -> None:
    """Sync, then fire and sleep forever (cancelled by the supervisor).

    :param clock: the time source (``SystemClock`` in production, ``ManualClock`` in tests).
    :param waker: woken to re-read the schedules at once.
    :param max_sleep: longest sleep between two reads of the table, seconds.
    """
    outage = Outage("scheduler")
    listener: Any = None

    def notified(*_: object) -> None:
        waker.wake()

    try:
        while True:
            try:
                await schedules.sync(clock.now())
                break
            except STORE_ERRORS as exc:
                await outage.failed(exc)
        outage.recovered()
        log.info("scheduler_started", schedules=sorted(schedules.declared))
        while True:
            try:
                if listener is None or listener.is_closed():
                    listener = await _listen(schedules, notified)
                waker.clear()
                await schedules.fire_due(clock.now())
                due = await schedules.next_due()
            except STORE_ERRORS as exc:
                await _release(schedules, listener)
                listener = None
                await outage.failed(exc)
                continue
            outage.recovered()
            deadline = clock.now() + timedelta(seconds=max_sleep)
            if due is not None and due < deadline:
                deadline = due
            await clock.sleep_until(deadline, waker)
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            await _release(schedules, listener)


async def _listen(schedules: Schedules, callback: Any) -> Any:
    """A pool connection listening on the schedules channel (held until released)."""
    conn = await schedules.tasks.pool.acquire()
    try:
        await conn.add_listener(NOTIFY_CHANNEL, callback)
    except BaseException:
        await schedules.tasks.pool.release(conn)
        raise
    return conn


async def _release(schedules: Schedules, conn: Any) -> None:
    if conn is None:
        return
    try:
        if not conn.is_closed():
            await conn.reset()  # drops the listener
        await schedules.tasks.pool.release(conn)
    except STORE_ERRORS:
        conn.terminate()
