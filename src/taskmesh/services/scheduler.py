"""Scheduler: fires cron schedules (docs/internals/design.md, section 5).

It syncs the instance's ``[[schedules]]`` into PostgreSQL, then loops: fire
what is due (:meth:`taskmesh.schedules.schedules.Schedules.fire_due`), read the earliest
next fire, and sleep until that instant, never more than ``max_sleep``
seconds (a schedule resumed through another instance is seen by then) and
less when woken: by this instance's API (pause, resume, trigger) or by a
PostgreSQL ``NOTIFY`` from any instance (sync, pause, resume, and every fire,
so that an instance that found a due row locked by another one re-reads it
once it moved on). No polling tick, no drift: every sleep is to an absolute
instant read from the clock, which in production is PostgreSQL's
(``clock.StoreClock``), so a host whose clock runs ahead fires nothing early.

The ``LISTEN`` runs on a connection of its own (``store.postgres.Listener``),
outside the pool: when PostgreSQL drops it (a restart, a failover, an
idle-connection killer) the scheduler opens another and carries on. Safe in
every instance at once (row locks and idempotency keys, see
``schedules.py``). Transient store failures are logged once per outage, with
backoff; a non-transient one is logged (``scheduler_error``) and retried after
``ERROR_RETRY_SECONDS``; any other exception is a bug and goes to the
supervisor's crash policy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import anyio
import asyncpg

from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.runtime.clock import Clock, Waker
from taskmesh.schedules.schedules import Schedules
from taskmesh.services.base import Outage, call_until_done
from taskmesh.store.postgres import Listener

log = get_logger("taskmesh.scheduler")

LOCKED_RETRY_SECONDS = 1.0
"""Longest wait before looking again at a due row another instance holds (it notifies when done)."""
ERROR_RETRY_SECONDS = 5.0
"""Pause after a store error retrying at once cannot fix, seconds."""


async def run(
    schedules: Schedules,
    clock: Clock,
    waker: Waker,
    *,
    max_sleep: float = 60.0,
    listener: Listener | None = None,
    connect: Callable[[], Awaitable[asyncpg.Connection]] | None = None,
) -> None:
    """Sync, then fire and sleep for ever (cancelled by the supervisor).

    :param clock: the time source (``StoreClock`` in production, ``ManualClock`` in tests).
    :param waker: woken to re-read the schedules at once (the listener wakes it too).
    :param max_sleep: longest sleep between two reads of the table, seconds.
    :param listener: the ``LISTEN`` connection (``None``: no notifications, only
        ``max_sleep`` and the waker).
    :param connect: how the listener opens its connection (tests inject one).
    """
    outage = Outage("scheduler")
    try:
        await call_until_done("scheduler", lambda: schedules.sync(clock.now()))
        log.info("scheduler_started", schedules=sorted(schedules.declared))
        while True:
            try:
                if listener is not None:
                    await listener.ensure(connect)
                waker.clear()
                fired_at = clock.now()
                fired = await schedules.fire_due(fired_at)
                due = await schedules.next_due()
            except StoreError as exc:
                if exc.transient:
                    await outage.failed(exc)
                else:  # a bad row or value: log it, try again later, never in a tight loop
                    log.error("scheduler_error", operation=exc.operation, error=str(exc))
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
                await listener.close()
