"""What ``benchmarks.workflows`` and ``benchmarks.limits`` share: sides, drains, fresh databases, instances.

A **side** is code an instance runs: this checkout's ``src`` (the ``taskmesh`` this process
imported), or a commit's exported with ``git archive`` (:func:`export_baseline`), each with a
template database migrated by its own migrations (``benchmarks.plain_fill``). A **drain** is one
fresh copy of a side's template, its work stored, then one fresh instance of the side's code
(``python -m taskmesh``, handler module ``benchmarks.bench_handler``, ``--concurrency`` executors,
``--prefetch``, ``--worker-processes``) launched and watched until every task has ended.

Stores: the PostgreSQL of ``DATABASE_URL`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``;
the role must be allowed to create databases), where the harness drops and creates ``--database`` and
the templates ``<database>_tpl`` (this checkout) and ``<database>_btpl`` (the baseline) beside it;
the Redis of ``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``), keys under the prefix ``<database>:``,
deleted before each drain.

A drain's figures (:class:`Drain`): its tasks over the span from the first run's ``started_at`` to
the last run's ``finished_at`` (``task_runs``, PostgreSQL's clock), so the instance's start-up is
left out; the time from launch until every task had ended; end to end, the time taken to store
the tasks (timed by whoever stored them) plus that span; CPU per task of the instance (its
children's included), of PostgreSQL's backends serving the database (``benchmarks.measure.BackendCpu``,
the harness's own watching connection left out) and of Redis; and whether every task completed with
exactly one run.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import asyncpg
import redis.asyncio as aioredis

import taskmesh
from benchmarks.bench import REDIS_NAMES, database_name, worker_processes
from benchmarks.measure import BackendCpu, cpu_by_name, cpu_of_tree, cpu_since, with_db
from taskmesh.clients.client import Client
from taskmesh.limits.book import LimitBook

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: the instances import ``benchmarks.bench_handler`` from it."""
POLL_SECONDS = 0.05
"""How often a drain asks PostgreSQL whether every task has ended."""


@dataclass(frozen=True)
class Side:
    """Code an instance runs: ``src`` goes first on its ``PYTHONPATH``; ``template``: its migrated database."""

    name: str
    src: Path
    template: str


@dataclass
class Drain:
    """One drain's figures (see the module docs); durations in seconds, CPU in µs per task."""

    label: str
    tasks: int
    store_s: float
    launch_s: float = 0.0
    span_s: float = 0.0
    instance_cpu_us: float = 0.0
    postgres_cpu_us: float = 0.0
    redis_cpu_us: float = 0.0
    exactly_once: bool = False
    detail: str = ""

    @property
    def drain_per_s(self) -> float:
        """Tasks over the span of their runs."""
        return self.tasks / self.span_s if self.span_s > 0 else 0.0

    @property
    def end_to_end_per_s(self) -> float:
        """Tasks over the store time plus the span of their runs."""
        return self.tasks / (self.store_s + self.span_s) if self.store_s + self.span_s > 0 else 0.0

    @property
    def cpu_us(self) -> float:
        """CPU per task of the instance and PostgreSQL together, µs."""
        return self.instance_cpu_us + self.postgres_cpu_us

    def line(self) -> str:
        """The drain's figures on one line."""
        return (
            f"  {self.label:<30} {self.tasks:>7,} tasks: store {self.store_s:6.2f} s, "
            f"drain {self.drain_per_s:7,.0f} tasks/s ({self.span_s:.2f} s; from launch {self.launch_s:.2f} s), "
            f"end to end {self.end_to_end_per_s:7,.0f} tasks/s; "
            f"CPU/task instance {self.instance_cpu_us:.0f} us, postgres {self.postgres_cpu_us:.0f} us, "
            f"redis {self.redis_cpu_us:.0f} us; exactly once {'yes' if self.exactly_once else 'NO'} ({self.detail})"
        )


D = TypeVar("D", bound=Drain)
P = TypeVar("P")
Q = TypeVar("Q")


class DrainBench:
    """The databases, instances and drains of one benchmark run (see the module docs).

    :param args: parsed with :func:`add_instance_arguments` (``database``, ``concurrency``, ``prefetch``,
        ``worker_processes``, ``timeout``).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.admin_url = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
        self.redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        self.database: str = args.database
        self.db_url = with_db(self.admin_url, self.database)
        self.prefix = self.database
        self.current = Side("this checkout", Path(taskmesh.__file__).resolve().parents[1], f"{self.database}_tpl")
        self.baseline: Side | None = None

    async def _admin(self, *statements: str) -> None:
        admin = await asyncpg.connect(self.admin_url)
        try:
            for statement in statements:
                await admin.execute(statement)
        finally:
            await admin.close()

    async def prepare(self, side: Side) -> None:
        """Create the side's template and migrate it with the side's own migrations."""
        await self._admin(f"DROP DATABASE IF EXISTS {side.template} WITH (FORCE)", f"CREATE DATABASE {side.template}")
        self.fill(side, "migrate", with_db(self.admin_url, side.template))

    async def prepare_baseline(self, commit: str) -> None:
        """Export ``commit``'s ``src`` (:func:`export_baseline`) as :attr:`baseline` and prepare its template."""
        self.baseline = Side(commit, export_baseline(commit), f"{self.database}_btpl")
        await self.prepare(self.baseline)

    async def drop_templates(self) -> None:
        """Drop the templates this run made."""
        sides = [self.current, *([self.baseline] if self.baseline else [])]
        await self._admin(*(f"DROP DATABASE IF EXISTS {s.template} WITH (FORCE)" for s in sides))

    async def fresh(self, side: Side) -> None:
        """The database a copy of the side's template; no key of the prefix; PostgreSQL's dirty pages written."""
        await self._admin(
            f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)",
            f"CREATE DATABASE {self.database} TEMPLATE {side.template}",
        )
        try:  # the copy's pages written now, not by a checkpoint in the middle of the drain
            await self._admin("CHECKPOINT")
        except asyncpg.InsufficientPrivilegeError:
            pass  # a role without pg_checkpoint: measured without it
        redis = aioredis.Redis.from_url(self.redis_url)
        try:
            async for key in redis.scan_iter(match=f"{self.prefix}:*", count=1000):
                await redis.delete(key)
        finally:
            await redis.aclose()

    def pythonpath(self, side: Side) -> str:
        """The side's ``src`` first, then the repository root (``benchmarks``)."""
        return os.pathsep.join([str(side.src), str(ROOT)])

    def fill(self, side: Side, *argv: str) -> float:
        """Run ``benchmarks.plain_fill ARGV`` on the side's code; the seconds it reports.

        :raises subprocess.CalledProcessError: it failed (its error output is shown).
        """
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.plain_fill", *argv],
            env={**os.environ, "PYTHONPATH": self.pythonpath(side)},
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            done.check_returncode()
        return float(json.loads(done.stdout.splitlines()[-1])["seconds"])

    def instance_env(self, side: Side) -> dict[str, str]:
        """The environment of the side's instance: the stores, the handlers, the executors; no HTTP."""
        return {
            **os.environ,
            "DATABASE_URL": self.db_url,
            "REDIS_URL": self.redis_url,
            "TASKMESH_REDIS_PREFIX": self.prefix,
            "PYTHONPATH": self.pythonpath(side),
            "TASKMESH_HANDLERS": "benchmarks.bench_handler",
            "WORKER_CONCURRENCY": str(self.args.concurrency),
            "TASKMESH_PREFETCH": str(self.args.prefetch),
            "TASKMESH_WORKER_PROCESSES": str(self.args.worker_processes),
            "HTTP_PORT": "0",
            "TASKMESH_LOG_LEVEL": "warning",
            "TASKMESH_MIGRATE_ON_START": "false",
        }

    def start_instance(self, side: Side, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``python -m taskmesh`` of the side's code on the database; ``env``: more variables."""
        full = {**self.instance_env(side), **(env or {})}
        return subprocess.Popen([sys.executable, "-m", "taskmesh"], env=full, stdout=subprocess.DEVNULL)

    @staticmethod
    def stop_instance(proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM, then SIGKILL after 40 s."""
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def client(self, pool_size: int = 4, limits: LimitBook | None = None) -> Client:
        """A client of this checkout on the database, for ``async with``; ``limits``: those its creates hold."""
        return Client(self.db_url, self.redis_url, redis_prefix=self.prefix, pool_size=pool_size, limits=limits)

    async def plain(self, side: Side, n: int, label: str) -> Drain:
        """``n`` tasks of ``bench.empty`` enqueued by the side's client (``benchmarks.plain_fill``), then drained."""
        await self.fresh(side)
        store = self.fill(side, "enqueue", self.db_url, self.redis_url, self.prefix, str(n), "bench.empty")
        return await self.drain(side, Drain(label, n, store))

    async def drain(
        self,
        side: Side,
        d: D,
        workflows: int = 0,
        env: Mapping[str, str] | None = None,
        after: Callable[[asyncpg.Connection, D], Awaitable[None]] | None = None,
    ) -> D:
        """Launch the side's instance (``env``: more variables) and wait until every task ended; fill in ``d``.

        :param workflows: as many workflows must have completed too.
        :param after: reads more of ``d``'s figures off the drained database, before it is closed.
        :raises RuntimeError: the instance exited, a task failed, or the drain outlasted ``--timeout``.
        """
        admin = await asyncpg.connect(self.admin_url)
        watch = await asyncpg.connect(self.db_url)
        backends = BackendCpu(admin, self.database, exclude={watch.get_server_pid()})
        try:
            await backends.start()
            rd0 = cpu_by_name(REDIS_NAMES)
            t0 = time.perf_counter()
            proc = self.start_instance(side, env)
            try:
                polled = 0.0
                while not await ended(watch, d.tasks):
                    if proc.poll() is not None:
                        raise RuntimeError(f"{d.label}: the instance exited with {proc.returncode}")
                    if time.perf_counter() - t0 > self.args.timeout:
                        raise RuntimeError(f"{d.label}: not over in {self.args.timeout} s ({await statuses(watch)})")
                    if time.perf_counter() - polled > 0.25:
                        await backends.poll()
                        polled = time.perf_counter()
                    await asyncio.sleep(POLL_SECONDS)
                d.launch_s = time.perf_counter() - t0
                cpu = cpu_of_tree(proc.pid)
                await backends.poll()
            finally:
                self.stop_instance(proc)
            d.instance_cpu_us = cpu / d.tasks * 1e6
            d.postgres_cpu_us = backends.total() / d.tasks * 1e6
            d.redis_cpu_us = cpu_since(rd0, REDIS_NAMES) / d.tasks * 1e6
            span = await watch.fetchval("SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM task_runs")
            d.span_s = float(span)
            await check(watch, d, workflows)
            if after is not None:
                await after(watch, d)
        finally:
            await watch.close()
            await admin.close()
        print(d.line(), file=sys.stderr)
        return d


async def pair(first_plain: bool, plain: Callable[[], Awaitable[P]], other: Callable[[], Awaitable[Q]]) -> tuple[P, Q]:
    """Run the two sides of a pair, the plain one first when ``first_plain``; returns (plain, other)."""
    if first_plain:
        a = await plain()
        return a, await other()
    b = await other()
    return await plain(), b


async def ended(conn: asyncpg.Connection, n: int) -> bool:
    """Whether the database holds ``n`` tasks, none of them not completed.

    :raises RuntimeError: a task failed, was cancelled or skipped.
    """
    row = await one(
        conn,
        "SELECT EXISTS (SELECT 1 FROM tasks WHERE status <> 'completed') AS open,"
        " EXISTS (SELECT 1 FROM tasks WHERE status IN ('failed', 'cancelled', 'skipped')) AS bad",
    )
    if row["bad"]:
        raise RuntimeError(f"a task did not complete ({await statuses(conn)})")
    return not row["open"] and await conn.fetchval("SELECT count(*) FROM tasks") == n


async def one(conn: asyncpg.Connection, sql: str) -> asyncpg.Record:
    """The one row of ``sql`` (a ``SELECT`` of aggregates or without ``FROM``)."""
    row = await conn.fetchrow(sql)
    assert row is not None  # a SELECT without FROM returns one row
    return row


async def statuses(conn: asyncpg.Connection) -> str:
    """The tasks counted by status, for an error message (``completed 1200, queued 3``)."""
    rows = await conn.fetch("SELECT status, count(*) AS n FROM tasks GROUP BY status ORDER BY status")
    return ", ".join(f"{r['status']} {r['n']}" for r in rows) or "no tasks"


async def check(conn: asyncpg.Connection, d: Drain, workflows: int) -> None:
    """Every task completed with one run; with ``workflows``, that many workflows, all completed."""
    row = await one(
        conn,
        "SELECT (SELECT count(*) FROM tasks) AS tasks,"
        " (SELECT count(*) FROM tasks WHERE status = 'completed') AS completed,"
        " (SELECT count(*) FROM task_runs) AS runs,"
        " (SELECT count(*) FROM (SELECT 1 FROM task_runs GROUP BY task_id HAVING count(*) > 1) x) AS duplicated",
    )
    d.exactly_once = row["tasks"] == row["completed"] == row["runs"] == d.tasks and row["duplicated"] == 0
    d.detail = f"tasks={row['tasks']} completed={row['completed']} runs={row['runs']} duplicated={row['duplicated']}"
    if workflows:
        done = await conn.fetchval("SELECT count(*) FROM workflows WHERE status = 'completed'")
        d.exactly_once = d.exactly_once and done == workflows
        d.detail += f" workflows completed={done}/{workflows}"


def export_baseline(commit: str) -> Path:
    """The ``src`` of ``commit``, exported with ``git archive`` under the temporary directory and byte-compiled.

    Kept by commit for the next run (``taskmesh-bench-baseline-<sha>``).

    :raises SystemExit: ``commit`` is not a commit of this repository.
    """
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        raise SystemExit(f"bench: {commit!r} is not a commit of {ROOT} (use --baseline none to skip the pair)")
    sha = found.stdout.strip()
    dest = Path(tempfile.gettempdir()) / f"taskmesh-bench-baseline-{sha[:12]}"
    if not (dest / "src" / "taskmesh" / "__init__.py").is_file():
        partial = dest.with_name(f"{dest.name}.{os.getpid()}")
        partial.mkdir(parents=True)
        archive = subprocess.Popen(["git", "archive", "--format=tar", sha, "src"], cwd=ROOT, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(partial)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"bench: git archive {sha} failed")
        try:
            partial.rename(dest)
        except OSError:  # another run exported it meanwhile
            subprocess.run(["rm", "-rf", str(partial)], check=True)
    compileall.compile_dir(dest / "src" / "taskmesh", quiet=1)
    return dest / "src"


# -- the report ------------------------------------------------------------------


def each(values: list[str], between: str = " / ") -> str:
    """One figure per round in turn (``r1 / r2``); ``-`` for none."""
    return between.join(values) if values else "-"


def met(ratios: list[float], goal: float) -> str:
    """Whether every ratio is at least ``goal``: ``yes``, ``no``, or in how many rounds."""
    hits = sum(1 for r in ratios if r >= goal)
    return "yes" if hits == len(ratios) else ("no" if not hits else f"{hits} of {len(ratios)} rounds")


def median(values: list[float]) -> float:
    """The median of ``values`` (0.0 for none)."""
    return statistics.median(values) if values else 0.0


# -- the command line --------------------------------------------------------------


def positive(text: str) -> int:
    """An argument that is a whole number from 1.

    :raises argparse.ArgumentTypeError: it is not one.
    """
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1, not {text!r}")
    return int(text)


def count(text: str) -> int:
    """An argument that is a whole number from 0.

    :raises argparse.ArgumentTypeError: it is not one.
    """
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}")
    return int(text)


def add_instance_arguments(parser: argparse.ArgumentParser, database: str) -> None:
    """The options :class:`DrainBench` reads: the instance's executors, prefetch and processes, the drain's
    time out, and the database (default ``database``) the run drops and creates."""
    parser.add_argument("--concurrency", type=positive, default=32, help="the instance's executors")
    parser.add_argument("--prefetch", type=positive, default=128, help="tasks claimed ahead (the prefetch setting)")
    parser.add_argument("--worker-processes", type=worker_processes, default=1, help="the instance's worker_processes")
    parser.add_argument("--timeout", type=positive, default=600, help="seconds a drain may take before the run fails")
    parser.add_argument(
        "--database",
        type=database_name,
        default=database,
        help="the database the benchmark DROPS (with FORCE) and creates, with <database>_tpl and _btpl; also "
        "the Redis key prefix",
    )
