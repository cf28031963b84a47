"""``python -m benchmarks.migration_locks --rows N``: what each migration locks, and for how long, on a big ``tasks``.

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
until then. Each migration's row says the strongest mode held on each table that existed before it
(tables it creates are listed as new), its wall time, and what that mode blocked on each table
and for how long: from the moment the mode was first seen to the commit. A file that PostgreSQL
refuses to run in a transaction block (``CREATE INDEX CONCURRENTLY``) is applied statement by
statement outside one instead, and its row says so; its locks are then only what the polls saw.

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
from benchmarks.locks import (
    BLOCKS_READS,
    BLOCKS_WRITES,
    MODES,
    TABLES_SQL,
    Watch,
    mode_name,
    split_statements,
    strongest,
)
from benchmarks.measure import with_db
from taskmesh.store import postgres

ROWS = 1_000_000
DATABASE = "taskmesh_migration_locks"
FILL = Path(__file__).with_name("migration_locks.sql")
_AFTER = re.compile(r"^-- after: (\d{4})\s*$", re.MULTILINE)
_DIRECTIVE = re.compile(r"^--\s*taskmesh:\s*([\w-]+)\s*$")
# As the store's migrate() makes it before the first migration.
SCHEMA_MIGRATIONS = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"""


@dataclass
class Measured:
    """One migration as applied: what it locked, how long it took and what it blocked.

    ``locks``: table -> strongest ``pg_locks`` mode, tables that existed before it only;
    ``blocked``: table -> (seconds writes waited, seconds reads waited), ``None`` when they did not;
    ``tasks``: the rows of ``tasks`` when it ran; ``notes``: its directives, and ``needs no-transaction``
    when PostgreSQL refused it in a transaction though it does not say ``no-transaction``.
    """

    version: int
    name: str
    summary: str
    seconds: float
    locks: dict[str, str]
    created: list[str]
    blocked: dict[str, tuple[float | None, float | None]]
    in_transaction: bool
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


def result(
    watch: Watch, before: dict[int, str], after: dict[int, str], end: float, in_transaction: bool
) -> tuple[dict[str, str], list[str], dict[str, tuple[float | None, float | None]]]:
    """The locks, new tables and blocked readers and writers of what ``watch`` saw, up to ``end``."""
    modes: dict[str, set[str]] = {}
    since: dict[str, dict[str, float]] = {}
    for (oid, mode), seen in watch.seen.items():
        if oid not in before:
            continue
        table = before[oid]
        modes.setdefault(table, set()).add(mode)
        # In a transaction a lock is held until the commit, from some moment after the last look
        # that did not see it (the longest it can have been). Outside one each statement holds its
        # own for as long as it runs: about one poll interval per look that saw it.
        held = end - seen.after if in_transaction else seen.looks * watch.interval
        for kind, weakest in (("writes", BLOCKS_WRITES), ("reads", BLOCKS_READS)):
            if MODES.index(mode) >= weakest:
                waits = since.setdefault(table, {})
                waits[kind] = max(held, waits.get(kind, 0.0))
    locks = {table: strongest(m) for table, m in modes.items()}
    blocked = {table: (s.get("writes"), s.get("reads")) for table, s in since.items()}
    created = sorted({name for oid, name in after.items() if oid not in before} - set(before.values()))
    return locks, created, blocked


async def apply(conn: Any, watcher: Any, file: File, interval: float, tasks: int) -> Measured:
    """Apply one migration on ``conn`` while ``watcher`` polls its locks; what it locked and took.

    :raises asyncpg.PostgresError: the migration failed (rolled back, if in a transaction).
    """
    before = await tables(conn)
    watch = Watch(watcher, await conn.fetchval("SELECT pg_backend_pid()"), interval)
    in_transaction = "no-transaction" not in file.directives
    notes = sorted(file.directives)
    async with watch.running():
        try:
            after = await _in_transaction(conn, watch, file) if in_transaction else None
        except asyncpg.ActiveSQLTransactionError:
            # The store would fail on it just so: measured outside one, and the row says so.
            notes.append("needs no-transaction")
            after = None
        if after is None:
            in_transaction = False
            after = await _outside_transaction(conn, watch, file)
        end = watch.now()
    locks, created, blocked = result(watch, before, after, end, in_transaction)
    return Measured(
        file.version, file.name, summary(file.sql), end, locks, created, blocked, in_transaction, tasks, notes
    )


async def _in_transaction(conn: Any, watch: Watch, file: File) -> dict[int, str]:
    """As the store applies one file; the tables just before the commit."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_id())
        await conn.execute(file.sql)
        await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", file.version, file.name)
        await watch.look(conn)
        return await tables(conn)


async def _outside_transaction(conn: Any, watch: Watch, file: File) -> dict[int, str]:
    """A ``no-transaction`` file: each statement on its own, under the session-level migration lock.

    A statement PostgreSQL lets run in a transaction block runs alone in one, which holds the
    same locks for as long as the statement's own implicit transaction would, and its locks are
    read just before that commits; the others (``CREATE INDEX CONCURRENTLY``) are only polled.
    """
    await conn.execute("SELECT pg_advisory_lock($1)", lock_id())
    try:
        for statement in file.statements:
            try:
                async with conn.transaction():
                    await conn.execute(statement)
                    await watch.look(conn)
            except asyncpg.ActiveSQLTransactionError:
                await conn.execute(statement)
        await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", file.version, file.name)
    finally:
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
    blocks = fill_blocks()
    measured = []
    try:
        await conn.execute("SELECT set_config('migration_locks.rows', $1, false)", str(rows))
        await conn.execute(SCHEMA_MIGRATIONS)
        tasks = 0
        for file in files():
            m = await apply(conn, watcher, file, interval, tasks)
            measured.append(m)
            _say(progress, f"{file.version:04d}_{file.name}: {m.seconds:.2f} s, {render_locks(m)}")
            if file.version in blocks:
                t0 = time.perf_counter()
                await fill(conn, blocks[file.version])
                tasks = await conn.fetchval("SELECT count(*) FROM tasks")
                _say(progress, f"  rows after {file.version:04d} added in {time.perf_counter() - t0:.1f} s")
    finally:
        await watcher.close()
        await conn.close()
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


def render_blocks(m: Measured) -> str:
    """What readers and writers of each table waited for, and how long, or ``nothing``."""
    parts = []
    for table in sorted(m.blocked, key=lambda t: (t != "tasks", t)):
        writes, reads = m.blocked[table]
        if reads is not None and writes is not None and writes - reads < 0.05:
            parts.append(f"{table}: reads and writes {_seconds(reads)}")
        elif reads is not None and writes is not None:
            parts.append(f"{table}: writes {_seconds(writes)}, reads the last {_seconds(reads)}")
        elif writes is not None:
            parts.append(f"{table}: writes {_seconds(writes)}")
    return "; ".join(parts) or "nothing"


def markdown(measured: list[Measured], rows: int) -> str:
    """The table of the module docs, one row per migration."""
    lines = [
        f"| migration | what it does | locks (table: mode) | time at {rows:,} tasks | blocks (for how long) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in measured:
        label = f"`{m.version:04d}_{m.name}`" + "".join(f" ({note})" for note in m.notes)
        took = _seconds(m.seconds) + ("" if m.tasks else " (no tasks yet)")
        cells = [label, m.summary, render_locks(m), took, render_blocks(m)]
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
