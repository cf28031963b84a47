"""Time sources: PostgreSQL's clock as seen from this instance, the system clock, a manual one for tests.

PostgreSQL's clock is the one clock of record for due times, leases and cron
fires: the claim checks ``run_at <= now()`` there, so an instance
whose own clock runs ahead must not move a delayed task early or fire a
schedule early. :class:`StoreClock` is the host's clock plus an offset measured
against PostgreSQL (``clock_sync`` refreshes it); services that need "now"
outside SQL (the delayed mover's scores, the scheduler, the executors' queue
wait) read it.

The scheduler never reads the time itself; it asks a :class:`Clock`, so that a
test can run a simulated hour (or a DST night) in milliseconds, and it never
sleeps for a fixed period: it sleeps until an absolute instant, which is what
keeps it from drifting over days.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

import anyio


class Waker:
    """A resettable wake-up signal: ``wake()`` ends the current (or next) sleep early.

    Set by the API on pause/resume/trigger and by PostgreSQL notifications, so a
    sleeping scheduler re-reads the schedules at once.
    """

    def __init__(self) -> None:
        self._event = anyio.Event()

    def wake(self) -> None:
        """End the current sleep (or the next one, when none is in progress)."""
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        """Wait for a wake-up, then re-arm."""
        await self._event.wait()
        self._event = anyio.Event()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = anyio.Event()


class Clock(Protocol):
    """What the scheduler needs of time."""

    def now(self) -> datetime:
        """The current instant, aware, in UTC."""
        ...

    async def sleep_until(self, when: datetime, waker: Waker) -> None:
        """Return at ``when`` (aware), or earlier when ``waker`` is woken."""
        ...


async def _sleep_until(now: datetime, when: datetime, waker: Waker) -> None:
    """Sleep on anyio's monotonic clock from ``now`` to ``when``, or until ``waker`` is woken."""
    delay = (when - now).total_seconds()
    if delay <= 0:
        return
    with anyio.move_on_after(delay):
        await waker.wait()


class SystemClock:
    """The real clock: ``datetime.now(UTC)``; sleeps on anyio's monotonic clock.

    Each sleep is computed from an absolute deadline, so errors never add up.
    """

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime, waker: Waker) -> None:
        """Return at ``when``, or earlier when ``waker`` is woken."""
        await _sleep_until(self.now(), when, waker)


class StoreClock:
    """The host's clock corrected to PostgreSQL's: ``now = time.time() + offset`` (see module docs).

    The offset is 0 until the first :meth:`sync`; each sync measures PostgreSQL's
    ``clock_timestamp()`` against the midpoint of the round trip, so the error is
    at most half the round trip (well under a millisecond on a LAN).
    """

    def __init__(self) -> None:
        self.offset = 0.0
        """Seconds to add to this host's clock to get PostgreSQL's."""

    def now(self) -> datetime:
        """PostgreSQL's time, aware, in UTC."""
        return datetime.fromtimestamp(time.time() + self.offset, UTC)

    def now_ms(self) -> int:
        """PostgreSQL's time in milliseconds since the Unix epoch."""
        return int((time.time() + self.offset) * 1000)

    def timestamp(self) -> float:
        """PostgreSQL's time in seconds since the Unix epoch."""
        return time.time() + self.offset

    async def sleep_until(self, when: datetime, waker: Waker) -> None:
        """Return at ``when`` by PostgreSQL's clock, or earlier when ``waker`` is woken."""
        await _sleep_until(self.now(), when, waker)

    async def sync(self, read_store_time: Callable[[], Awaitable[datetime]]) -> float:
        """Measure the offset once.

        :param read_store_time: reads PostgreSQL's clock (``PgStore.now``).
        :returns: the new offset in seconds (positive: PostgreSQL is ahead of this host).
        :raises StoreError: PostgreSQL did not answer (the old offset stays).
        """
        before = time.time()
        remote = await read_store_time()
        after = time.time()
        self.offset = remote.timestamp() - (before + after) / 2
        return self.offset


class ManualClock:
    """A clock that moves only when told to (tests, simulations).

    :param start: the initial instant (aware).

    ``advance(seconds)`` or ``set(instant)`` moves it and releases every sleeper
    whose deadline has come; sleepers never wait on real time.
    """

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be an aware datetime")
        self._now = start.astimezone(UTC)
        self._moved = anyio.Event()

    def now(self) -> datetime:
        return self._now

    def set(self, instant: datetime) -> None:
        """Jump to ``instant`` (forwards or backwards, as a stepped system clock can)."""
        self._now = instant.astimezone(UTC)
        self._moved.set()
        self._moved = anyio.Event()

    def advance(self, seconds: float) -> None:
        """Move forwards by ``seconds``."""
        self.set(self._now + timedelta(seconds=seconds))

    async def sleep_until(self, when: datetime, waker: Waker) -> None:
        async with anyio.create_task_group() as tg:

            async def woken() -> None:
                await waker.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(woken)
            while self._now < when:
                await self._moved.wait()
            tg.cancel_scope.cancel()
