"""What callers of ``tasks`` feel while a migration runs: how long a write's and a read's table lock waited.

Used by ``benchmarks.migration_locks``. A write (INSERT, UPDATE, DELETE: a create, a claim, a
result, retention) first takes ``ROW EXCLUSIVE`` on the table, a plain read (SELECT) ``ACCESS
SHARE``: a probe asks for just that lock, over and over, each time in a transaction of its own
that ends as soon as the lock is granted, and notes how long each one waited.

The whole transaction is one message to the server (``BEGIN; ...; COMMIT``), so a probe never
holds a transaction open while it is idle: ``CREATE INDEX CONCURRENTLY`` waits out every open
transaction, and a probe idling in one would lengthen what it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg

WRITE = "ROW EXCLUSIVE"
"""The lock of INSERT, UPDATE and DELETE."""
READ = "ACCESS SHARE"
"""The lock of SELECT."""
PAUSE_SECONDS = 0.01
"""Between one probe's end and the next one's start: a caller every 10 ms, not a lock held in a loop."""
LOCK_TIMEOUT = "15min"
"""Longer than any migration holds a lock at the sizes measured: a probe waits, it does not give up."""


@dataclass
class Probe:
    """One connection that takes ``mode`` on ``table`` again and again while a migration runs.

    :param conn: a connection of the probe's own (neither the migration's nor the watcher's).
    :param mode: :data:`WRITE` or :data:`READ` (a ``LOCK TABLE`` mode).
    :param table: the table it locks.
    :param pause: seconds between two probes.
    :param waits: seconds each probe took, from the request to the commit (the lock's wait, plus a
        round trip to the server of well under a millisecond).
    """

    conn: Any
    mode: str
    table: str = "tasks"
    pause: float = PAUSE_SECONDS
    waits: list[float] = field(default_factory=list)

    def longest(self) -> float | None:
        """The longest wait in seconds, ``None`` when it never probed."""
        return max(self.waits, default=None)

    async def once(self) -> float:
        """Take the lock in a short transaction of its own; the seconds that took.

        :raises asyncpg.PostgresError: the lock was not granted within :data:`LOCK_TIMEOUT`, or
            the table is gone (the transaction is rolled back first).
        """
        sql = f"BEGIN; SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; LOCK TABLE {self.table} IN {self.mode} MODE; COMMIT"
        start = time.perf_counter()
        try:
            await self.conn.execute(sql)
        except asyncpg.PostgresError:
            # An error after BEGIN leaves the session in a failed transaction block.
            await self.conn.execute("ROLLBACK")
            raise
        wait = time.perf_counter() - start
        self.waits.append(wait)
        return wait

    async def run(self, stop: asyncio.Event) -> None:
        """Probe every :attr:`pause` seconds until ``stop`` is set, at least once.

        Never cancelled halfway: a probe in flight when ``stop`` is set still completes (its
        transaction must not be left open), and its wait counts.
        """
        while True:
            await self.once()
            if stop.is_set():
                return
            await asyncio.sleep(self.pause)


@contextlib.asynccontextmanager
async def probing(probes: list[Probe]) -> AsyncIterator[list[Probe]]:
    """Run ``probes`` while the block runs; at its end each finishes its probe in flight.

    :raises asyncpg.PostgresError: a probe failed (see :meth:`Probe.once`).
    """
    stop = asyncio.Event()
    tasks = [asyncio.create_task(p.run(stop)) for p in probes]
    try:
        yield probes
    finally:
        stop.set()
        await asyncio.gather(*tasks)
