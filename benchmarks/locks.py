"""What a migration locks: PostgreSQL's table lock modes, what each blocks, and a watch on one backend.

Used by ``benchmarks.migration_locks``. The modes are PostgreSQL's eight table-level modes
(https://www.postgresql.org/docs/current/explicit-locking.html), weakest first. Plain reads take
ACCESS SHARE, so only ACCESS EXCLUSIVE blocks them; writes take ROW EXCLUSIVE, so SHARE and every
stronger mode block them; EXCLUSIVE also blocks ``SELECT ... FOR UPDATE`` (ROW SHARE), the claim's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

MODES = [
    "AccessShareLock",
    "RowShareLock",
    "RowExclusiveLock",
    "ShareUpdateExclusiveLock",
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
]
"""``pg_locks.mode`` of the table-level modes, weakest first."""

# The tables of the migrated database, partitions named by their root (a lock on an audit_events
# partition is one on the audit log), with the runner's own bookkeeping table left out.
TABLES_SQL = """
SELECT c.oid::bigint AS oid, root.relname AS name
FROM pg_class c JOIN pg_class root ON root.oid = coalesce(pg_partition_root(c.oid), c.oid)
WHERE c.relkind IN ('r', 'p') AND c.relnamespace = 'public'::regnamespace AND root.relname <> 'schema_migrations'
"""
LOCKS_SQL = """
SELECT relation::bigint AS oid, mode FROM pg_locks
WHERE pid = $1 AND locktype = 'relation' AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def mode_name(mode: str) -> str:
    """``ShareRowExclusiveLock`` as the docs write it: ``SHARE ROW EXCLUSIVE``."""
    words: list[str] = []
    for char in mode.removesuffix("Lock"):
        if char.isupper() and words:
            words.append(" ")
        words.append(char.upper())
    return "".join(words)


def strongest(modes: set[str]) -> str:
    """The strongest of ``modes`` (``pg_locks.mode`` names)."""
    return max(modes, key=MODES.index)


@dataclass
class Seen:
    """A mode on a table: the looks that saw it held, in seconds from the migration's start.

    ``after``: the look before the first that saw it (or the start), which did not: the lock
    was taken between the two.
    """

    after: float
    first: float
    last: float
    looks: int = 1


@dataclass
class Watch:
    """The relation locks one backend holds while a migration runs, polled from another connection.

    A lock taken and released between two polls is missed: the migration's own look at its
    locks just before it commits (:meth:`record`) completes it, as it holds every lock it took
    until then.

    :param conn: the watching connection (not the migration's).
    :param pid: the migration's backend.
    :param interval: seconds between polls.
    """

    conn: Any
    pid: int
    interval: float
    start: float = field(default_factory=time.perf_counter)
    seen: dict[tuple[int, str], Seen] = field(default_factory=dict)
    previous: float = 0.0

    def now(self) -> float:
        """Seconds since the migration started."""
        return time.perf_counter() - self.start

    def record(self, rows: list[Any], at: float) -> None:
        """Note the ``(oid, mode)`` rows of one look at the backend's locks, begun at ``at`` (:meth:`now`)."""
        for row in rows:
            if row["mode"] not in MODES:
                continue
            key = (row["oid"], row["mode"])
            if key in self.seen:
                self.seen[key].last = at
                self.seen[key].looks += 1
            else:
                self.seen[key] = Seen(self.previous, at, at)
        self.previous = at

    async def look(self, conn: Any) -> None:
        """One look at the migration's locks through ``conn`` (the watcher's, or the migration's own)."""
        at = self.now()
        self.record(await conn.fetch(LOCKS_SQL, self.pid), at)

    async def _poll(self) -> None:
        while True:
            await self.look(self.conn)
            await asyncio.sleep(self.interval)

    @contextlib.asynccontextmanager
    async def running(self) -> Any:
        """Poll while the block runs."""
        self.start, self.previous = time.perf_counter(), 0.0
        task = asyncio.create_task(self._poll())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def split_statements(sql: str) -> list[str]:
    """``sql`` cut into its statements at the semicolons outside quotes, comments and ``$tag$`` bodies.

    What psql does before it sends a file statement by statement, as a migration that cannot run
    in a transaction block (``CREATE INDEX CONCURRENTLY``) must be sent. Statements that are only
    comments are dropped.
    """
    out, start, i, n = [], 0, 0, len(sql)
    while i < n:
        if sql.startswith("--", i):
            i = sql.find("\n", i) if "\n" in sql[i:] else n
        elif sql.startswith("/*", i):
            i = sql.find("*/", i + 2) + 2 if "*/" in sql[i + 2 :] else n
        elif sql[i] in "'\"":
            end = sql.find(sql[i], i + 1)
            i = (end if end >= 0 else n - 1) + 1
        elif sql[i] == "$" and (tag_end := sql.find("$", i + 1)) > i and _is_tag(sql[i + 1 : tag_end]):
            tag = sql[i : tag_end + 1]
            end = sql.find(tag, tag_end + 1)
            i = end + len(tag) if end >= 0 else n
        elif sql[i] == "$" and sql.startswith("$$", i):
            end = sql.find("$$", i + 2)
            i = end + 2 if end >= 0 else n
        elif sql[i] == ";":
            out.append(sql[start:i])
            i += 1
            start = i
        else:
            i += 1
    out.append(sql[start:])
    return [s.strip() for s in out if _has_code(s)]


def _is_tag(text: str) -> bool:
    return text.replace("_", "").isalnum() and not text[0].isdigit()


def _has_code(statement: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in statement.splitlines())
