"""Scheduler: fires cron schedules (design.md section 5, issue 5).

It syncs the instance's ``[[schedules]]`` into PostgreSQL, then loops: fire
what is due (:meth:`taskmesh.schedules.Schedules.fire_due`), read the earliest
next fire, and sleep until that instant, never more than ``max_sleep``
seconds (a schedule resumed through another instance is seen by then) and
less when woken: by this instance's API (pause, resume, trigger) or by a
PostgreSQL ``NOTIFY`` from any instance (sync, pause, resume, and every fire,
so that an instance that found a due row locked by another one re-reads it
once it moved on). No polling tick, no drift: every sleep is to an absolute
instant read from the clock.

The ``LISTEN`` runs on a connection of its own (``listen``), outside the pool:
when PostgreSQL drops it (a restart, a failover, an idle-connection killer)
the scheduler opens another and carries on. Safe in every instance at once
(row locks and idempotency keys, see ``schedules.py``). Store failures are
logged once per outage, with backoff; an unexpected error is logged with its
traceback and retried, so that it stops the schedules, never the instance.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import structlog

from taskmesh.clock import Clock, Waker
from taskmesh.schedules import NOTIFY_CHANNEL, Schedules
from taskmesh.services.outage import STORE_ERRORS, Outage

log = structlog.get_logger("taskmesh.scheduler")

LOCKED_RETRY_SECONDS = 1.0
"""Longest wait before looking again at a due row another instance holds (it notifies when done)."""
ERROR_RETRY_SECONDS = 5.0
"""Pause after an unexpected error before the scheduler tries again, seconds."""


async def run(
    schedules: Schedules,
    clock: Clock,
    waker: Waker,
    *,
    max_sleep: float = 60.0,
    listen: Callable[[], Awaitable[asyncpg.Connection]] | None = None,
) -> None:
    """Sync, then fire and sleep forever (cancelled by the supervisor).

    :param clock: the time source (``SystemClock`` in production, ``ManualClock`` in tests).
    :param waker: woken to re-read the schedules at once.
    :param max_sleep: longest sleep between two reads of the table, seconds.
    :param listen: opens a connection for ``LISTEN`` (``None``: no notifications, only
        ``max_sleep`` and the waker).
    """
    outage = Outage("scheduler")
    listener: asyncpg.Connection | None = None

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
                if listen is not None and (listener is None or listener.is_closed()):
                    listener = await _listen(listen, notified, listener)
                waker.clear()
                fired_at = clock.now()
                fired = await schedules.fire_due(fired_at)
                due = await schedules.next_due()
            except STORE_ERRORS as exc:
                await outage.failed(exc)
                continue
            except Exception as exc:  # a bug or a bad row must not take the instance down
                log.error("scheduler_error", error=f"{type(exc).__name__}: {exc}", exc_info=True)
                await anyio.sleep(ERROR_RETRY_SECONDS)
                continue
            outage.recovered()
            now = clock.now()
            deadline = now + timedelta(seconds=max_sleep)
            if due is not None and due <= fired_at and not fired:
                # Due when we looked, yet nothing fired: another instance holds the row. It
                # notifies when done; look again after a second at most, not in a busy loop.
                deadline = min(deadline, now + timedelta(seconds=LOCKED_RETRY_SECONDS))
            elif due is not None:
                deadline = min(deadline, due)
            await clock.sleep_until(deadline, waker)
    finally:
        if listener is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                await _close(listener)


async def _listen(
    connect: Callable[[], Awaitable[asyncpg.Connection]], callback: Any, old: asyncpg.Connection | None
) -> asyncpg.Connection:
    """A fresh connection listening on the schedules channel (the old one, if any, is dropped)."""
    if old is not None:
        await _close(old)
    conn = await connect()
    try:
        await conn.add_listener(NOTIFY_CHANNEL, callback)
    except BaseException:
        await _close(conn)
        raise
    return conn


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await conn.close(timeout=1)
    except STORE_ERRORS:
        conn.terminate()
