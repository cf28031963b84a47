"""``python -m benchmarks.migration_locks --rows N``: what each migration locks on a big ``tasks``, and who waits.

Run it from the repository root (``make migration-locks``, ``ARGS="--rows 2000"`` for a quick look).
It creates the database ``taskmesh_migration_locks`` (``--database``; dropped with FORCE first, and
at the end unless ``--keep``) on the PostgreSQL of ``--database-url`` (default:
``TASKMESH_TEST_DATABASE_URL``, else ``DATABASE_URL``, else ``postgresql://postgres@127.0.0.1:5432/postgres``;
the role must be allowed to create databases), then applies every file of
``src/taskmesh/store/migrations/`` one at a time, as ``taskmesh migrate`` does: in a transaction of
its own under the migration lock, recorded in ``schema_migrations``. After a migration, the block of
``benchmarks/migration_locks.sql`` that names it, if any, adds rows (unmeasured): after 0001,
``--rows`` tasks and their runs, so every later migration meets them.

While a migration runs, a second connection polls ``pg_locks`` for the migration's backend every
``--poll-ms``; just before the migration commits, it also reads its own locks, which it holds
until then. A ``no-transaction`` file is applied as the store applies it straight to PostgreSQL
(``taskmesh.store.migrator``): statement by statement, with ``taskmesh.migrate_batches`` on, so
that a copy in batches commits after each one; a statement that PostgreSQL lets run in a
transaction block (and that does not commit itself) runs alone in one, so that its locks are read
the same way, the others (``CREATE INDEX CONCURRENTLY``, a ``DO`` block that commits) are only
polled. A transactional file that PostgreSQL refuses in a transaction block is applied so too,
and its row says so.

Once ``tasks`` exists, two more connections play its callers while a migration runs
(``benchmarks.probes``): one takes the lock of a write (``ROW EXCLUSIVE``), the other that of a
read (``ACCESS SHARE``), each in a short transaction of its own, again and again 10 ms apart.
Each migration's row says the strongest mode held on each table that existed before it (tables
it creates are listed as new), its wall time, and the longest that a write and a read of
``tasks`` waited for their lock.

The markdown table goes to standard output, then the date, machine and command; progress to standard error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.bench import database_name
from benchmarks.locks import TABLES_SQL, Watch, mode_name, split_statements, strongest
from benchmarks.measure import with_db
from benchmarks.probes import READ, WRITE, Probe, probing
from taskmesh.store import postgres

ROWS = 1_000_000
DATABASE = "taskmesh_migration_locks"
FILL = Path(__file__).with_name("migration_locks.sql")
_AFTER = re.compile(r"^-- after: (\d{4})\s*$", re.MULTILINE)
_DIRECTIVE = re.compile(r"^--\s*taskmesh:\s*([\w-]+)\s*$")
# A statement that ends its own transactions (a copy in batches) cannot run inside a block.
_ENDS_TRANSACTIONS = re.compile(r"\b(COMMIT|ROLLBACK)\b", re.IGNORECASE)
# What PostgreSQL answers to a statement that must run outside a transaction block.
_NOT_IN_A_BLOCK = (asyncpg.ActiveSQLTransactionError, asyncpg.InvalidTransactionTerminationError)
# As the store's migrate() makes it before the first migration.
SCHEMA_MIGRATIONS = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"""


@dataclass
class Measured:
    """One migration as applied: what it locked, how long it took and how long callers of ``tasks`` waited.

    ``locks``: table -> strongest ``pg_locks`` mode, tables that existed before it only;
    ``write_waits``, ``read_waits``: seconds each probe's write or read lock on ``tasks`` waited
    (empty before ``tasks`` exists); ``outside``: the statements run outside a transaction block;
    ``tasks``: the rows of ``tasks`` when it ran; ``notes``: its directives, and ``needs no-transaction``
    when PostgreSQL refused it in a transaction though it does not say ``no-transaction``.
    """

    version: int
    name: str
    summary: str
    seconds: float
    locks: dict[str, str]
    created: list[str]
    write_waits: list[float]
    read_waits: list[float]
    outside: list[str]
    tasks: int
    notes: list[str]


@dataclass(frozen=True)
class File:
    """One migration file as the store reads it: ``directives`` from its first lines (``no-transaction``, ...)."""

    version: int
    name: str
    sql: str
    directives: frozenset[str]
    statements: list[str]
    """How the store splits a ``no-transaction`` file (else this module's split)."""


def files() -> list[File]:
    """The store's migration files, by version, whether it lists them as tuples or as objects."""
    found = []
    for entry in postgres.migrations():
        item: Any = entry  # (version, name, sql), or an object with those attributes and more
        version, name, sql = item if isinstance(item, tuple) else (item.version, item.name, item.sql)
        directives = set()
        for line in sql.splitlines():
            if not line.startswith("--"):
                break
            if match := _DIRECTIVE.match(line):
                directives.add(match.group(1))
        split = item.statements() if hasattr(item, "statements") else split_statements(sql)
        found.append(File(version, name, sql, frozenset(directives), split))
    return found


def lock_id() -> int:
    """The store's migration lock (``pg_advisory_xact_lock``), wherever the store keeps it."""
    for module in ("taskmesh.store.migrator", "taskmesh.store.postgres"):
        with contextlib.suppress(ImportError):
            found = getattr(importlib.import_module(module), "MIGRATION_LOCK_ID", None)
            if found is not None:
                return int(found)
    raise LookupError("no MIGRATION_LOCK_ID in taskmesh.store")


def fill_blocks() -> dict[int, str]:
    """The blocks of ``migration_locks.sql`` by the migration they follow."""
    parts = _AFTER.split(FILL.read_text())
    return {int(version): body for version, body in zip(parts[1::2], parts[2::2], strict=True)}


def summary(sql: str) -> str:
    """The first sentence of a migration's leading comment, cut near 90 characters."""
    lines = []
    for line in sql.splitlines():
        if not line.startswith("--") or not line.strip("- "):
            break
        if not _DIRECTIVE.match(line):
            lines.append(line.removeprefix("--").strip())
    text, depth = " ".join(lines), 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ".:" and text[i + 1 : i + 2] in ("", " "):
            text = text[: i + 1].rstrip(":")
            break
    return text if len(text) <= 90 else text[:88].rsplit(" ", 1)[0] + " …"


async def tables(conn: Any) -> dict[int, str]:
    """oid -> table name of the database's tables as ``conn`` sees them (partitions named by their root)."""
    return {row["oid"]: row["name"] for row in await conn.fetch(TABLES_SQL)}


def result(watch: Watch, before: dict[int, str], after: dict[int, str]) -> tuple[dict[str, str], list[str]]:
    """The strongest mode ``watch`` saw on each table of ``before``, and the tables new in ``after``."""
    modes: dict[str, set[str]] = {}
    for oid, mode in watch.seen:
        if oid in before:
            modes.setdefault(before[oid], set()).add(mode)
    locks = {table: strongest(m) for table, m in modes.items()}
    created = sorted({name for oid, name in after.items() if oid not in before} - set(before.values()))
    return locks, created


async def apply(conn: Any, watcher: Any, probes: list[Any], file: File, interval: float, tasks: int) -> Measured:
    """Apply one migration on ``conn`` while ``watcher`` polls its locks and ``probes`` play callers of ``tasks``.

    :param probes: two connections of their own, for a write's and a read's probe.
    :raises asyncpg.PostgresError: the migration failed (rolled back, if in a transaction), or a probe did.
    """
    before = await tables(conn)
    watch = Watch(watcher, await conn.fetchval("SELECT pg_backend_pid()"), interval)
    callers = [Probe(probes[0], WRITE), Probe(probes[1], READ)] if "tasks" in before.values() else []
    notes, outside = sorted(file.directives), list[str]()
    async with probing(callers), watch.running():
        try:
            after = await _in_transaction(conn, watch, file) if "no-transaction" not in file.directives else None
        except _NOT_IN_A_BLOCK:
            # The store would fail on it just so: measured outside one, and the row says so.
            notes.append("needs no-transaction")
            after = None
        if after is None:
            after = await _outside_transaction(conn, watch, file, outside)
        end = watch.now()
    locks, created = result(watch, before, after)
    writes, reads = (callers[0].waits, callers[1].waits) if callers else ([], [])
    return Measured(
        file.version, file.name, summary(file.sql), end, locks, created, writes, reads, outside, tasks, notes
    )


async def _in_transaction(conn: Any, watch: Watch, file: File) -> dict[int, str]:
    """As the store applies one file; the tables just before the commit."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_id())
        await conn.execute(file.sql)
        await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", file.version, file.name)
        await watch.look(conn)
        return await tables(conn)


async def _outside_transaction(conn: Any, watch: Watch, file: File, outside: list[str]) -> dict[int, str]:
    """A ``no-transaction`` file as the store applies it straight to PostgreSQL (module docs).

    A statement PostgreSQL lets run in a transaction block runs alone in one, which holds the
    same locks for as long as the statement's own implicit transaction would, and its locks are
    read just before that commits; the others are only polled, and appended to ``outside``.
    """
    await conn.execute("SELECT pg_advisory_lock($1)", lock_id())
    try:
        await conn.execute("SET taskmesh.migrate_batches = on")
        for statement in file.statements:
            if not _ENDS_TRANSACTIONS.search(statement):
                try:
                    async with conn.transaction():
                        await conn.execute(statement)
                        await watch.look(conn)
                    continue
                except _NOT_IN_A_BLOCK:
                    pass
            outside.append(statement)
            await conn.execute(statement)
        await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", file.version, file.name)
    finally:
        await conn.execute("RESET taskmesh.migrate_batches")
        await conn.execute("SELECT pg_advisory_unlock($1)", lock_id())
    return await tables(conn)


async def fill(conn: Any, block: str) -> None:
    """Run one block of ``migration_locks.sql``, statement by statement."""
    for statement in split_statements(block):
        await conn.execute(statement)


async def measure(url: str, rows: int, interval: float = 0.02, progress: bool = True) -> list[Measured]:
    """Apply every migration to the empty database of ``url``, filling it on the way; each one's figures.

    :param rows: tasks put in after migration 0001.
    :param interval: seconds between two polls of the migration's locks.
    :raises asyncpg.PostgresError: a migration or a fill block failed.
    """
    conn = await asyncpg.connect(url)
    watcher = await asyncpg.connect(url)
    probes = [await asyncpg.connect(url), await asyncpg.connect(url)]
    blocks = fill_blocks()
    measured = []
    try:
        await conn.execute("SELECT set_config('migration_locks.rows', $1, false)", str(rows))
        await conn.execute(SCHEMA_MIGRATIONS)
        tasks = 0
        for file in files():
            m = await apply(conn, watcher, probes, file, interval, tasks)
            measured.append(m)
            waited = f"waits: write {render_wait(m.write_waits)}, read {render_wait(m.read_waits)}"
            _say(progress, f"{file.version:04d}_{file.name}: {m.seconds:.2f} s, {render_locks(m)}, {waited}")
            if file.version in blocks:
                t0 = time.perf_counter()
                await fill(conn, blocks[file.version])
                tasks = await conn.fetchval("SELECT count(*) FROM tasks")
                _say(progress, f"  rows after {file.version:04d} added in {time.perf_counter() - t0:.1f} s")
    finally:
        for other in [*probes, watcher, conn]:
            await other.close()
    return measured


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


def _seconds(s: float) -> str:
    return "< 0.01 s" if s < 0.01 else f"{s:.2f} s"


def render_locks(m: Measured) -> str:
    """``tasks: SHARE; new: queues`` (``tasks`` first), or ``none``."""
    order = sorted(m.locks, key=lambda t: (t != "tasks", t))
    parts = [f"{t}: {mode_name(m.locks[t])}" for t in order]
    if m.created:
        parts.append("new: " + ", ".join(m.created))
    return "; ".join(parts) or "none"


def render_wait(waits: list[float]) -> str:
    """The longest of a probe's ``waits`` (``0.42 s``), or ``–`` when there was no ``tasks`` to probe."""
    return _seconds(max(waits)) if waits else "–"


def markdown(measured: list[Measured], rows: int) -> str:
    """The table of the module docs, one row per migration."""
    lines = [
        f"| migration | what it does | locks (table: mode) | time at {rows:,} tasks "
        "| longest wait of a write to tasks | longest wait of a read of tasks |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in measured:
        label = f"`{m.version:04d}_{m.name}`" + "".join(f" ({note})" for note in m.notes)
        took = _seconds(m.seconds) + ("" if m.tasks else " (no tasks yet)")
        cells = [label, m.summary, render_locks(m), took, render_wait(m.write_waits), render_wait(m.read_waits)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def machine(server_version: str) -> str:
    """The date, host and PostgreSQL of this run, as the docs quote it."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    model = names[0] if names else platform.processor() or platform.machine()
    return f"{datetime.now(UTC):%Y-%m-%d}, {model}, {os.cpu_count()} cores, PostgreSQL {server_version}"


async def run(args: argparse.Namespace) -> None:
    """Measure into a fresh database ``args.database`` and print the table."""
    admin = await asyncpg.connect(args.database_url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {args.database}")
        server = await admin.fetchval("SHOW server_version")
        try:
            measured = await measure(with_db(args.database_url, args.database), args.rows, args.poll_ms / 1000)
        finally:
            if not args.keep:
                await admin.execute(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)")
    finally:
        await admin.close()
    print(markdown(measured, args.rows))
    print(f'\nMeasured {machine(server.split()[0])}: `make migration-locks ARGS="--rows {args.rows}"`.')


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.migration_locks``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.migration_locks", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS, help="tasks put in after migration 0001 (default 1,000,000)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("TASKMESH_TEST_DATABASE_URL")
        or os.environ.get("DATABASE_URL")
        or "postgresql://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL URL whose role may create databases (default: TASKMESH_TEST_DATABASE_URL, DATABASE_URL)",
    )
    parser.add_argument(
        "--database", type=database_name, default=DATABASE, help="the database it DROPS (with FORCE) and fills"
    )
    parser.add_argument("--poll-ms", type=float, default=20.0, help="milliseconds between polls of pg_locks")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TASKMESH_LOG_LEVEL", "warning")
    sys.exit(main())
