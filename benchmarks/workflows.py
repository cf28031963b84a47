"""``python -m benchmarks.workflows``: what running tasks as a workflow costs, beside plain tasks in the same run.

Run it from the repository root (``make bench-workflows``; a quick look:
``make bench-workflows ARGS="--fanout 500 --chains 200 --baseline-tasks 2000 --rounds 1"``); it is not
part of the installed package. Stores as ``benchmarks.bench``: the PostgreSQL of ``DATABASE_URL``
(default ``postgresql://postgres@127.0.0.1:5432/postgres``; the role must be allowed to create
databases), where it drops and creates the database ``--database`` (``taskmesh_wfbench``) and two
templates beside it (``<database>_tpl`` and ``<database>_btpl``, dropped at the end), and the Redis
of ``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``), keys under the prefix ``<database>:``.

Every drain runs on a fresh copy of a migrated template with a fresh instance (``python -m
taskmesh``, handler module ``benchmarks.bench_handler``, one process, ``--concurrency`` executors,
``--prefetch``), launched once its work is stored, until every task has ended. Each round runs
three pairs, the two sides of a pair one after the other, taking turns to go first (round 1 the
plain side first, round 2 the other):

1. **fan-out**: one workflow of a root whose result is a list of ``--fanout`` items (``bench.fanout``),
   a map node over that result (one task per item, made when the root ends) and a join after the
   map; against ``--fanout + 2`` plain tasks;
2. **chains**: ``--chains`` workflows ``a -> b -> c``, submitted through the workflow facade in
   batches of 1,000 (``Workflows.submit_many``: one transaction of a few multi-row statements per
   batch, then its roots' push, as ``client.submit_workflows`` and ``POST /api/v1/workflows:batch``
   do); against ``3 x --chains`` plain tasks, enqueued 1,000 a call likewise;
3. **baseline**: ``--baseline-tasks`` plain tasks drained by the code of ``--baseline`` (default
   ``1c898d0``, the commit before workflows) against the same drained by this checkout. The
   baseline's ``src/`` is exported with ``git archive`` into a folder of the temporary directory
   (kept for the next run); its instance, its migrations and its enqueue run with it first on
   ``PYTHONPATH`` (``benchmarks.plain_fill``), this checkout's with the ``src`` of the
   ``taskmesh`` this process imported. ``--baseline none`` skips the pair.

Plain tasks are enqueued by ``Client.enqueue_many``, 1,000 a call. Every handler does nothing
(``bench.empty``; the fan-out's root returns its list): what is measured is taskmesh's own
cost, where a workflow's share of it is largest.

Then once, **at rest**: on a running instance that has run a warm-up chain, ``--rest-chains``
chains submitted one by one at ``--rest-rate`` per second; beside their joins' delay, the pickup of
their roots (creation to the run's start: the path of any enqueued task) at the same moments, for
scale. ``--rounds 0`` runs only this phase.

Figures, per drain:

- **drain, tasks/s**: the tasks over the span from the first run's ``started_at`` to the last run's
  ``finished_at`` (``task_runs``, PostgreSQL's clock), so the instance's start-up is left out on
  both sides; also the time **from launch** until the benchmark saw every task ended;
- **end to end, tasks/s**: the tasks over the store time (the enqueue or the submissions, timed
  here) plus that span;
- **CPU per task**: the instance's (its children's included, start-up included), PostgreSQL's
  backends serving the database (``benchmarks.measure.BackendCpu``; the benchmark's own watching
  connection left out) and Redis's;
- **join delay**: for each task of a task node with deps (the fan-out's join; a chain's ``b`` and
  ``c``), its run's ``started_at`` minus the latest ``finished_at`` of its deps' runs, both
  PostgreSQL's clock: commit of the last dep's result, the trigger's release, the notification,
  the push and the claim. In a drain a released task waits behind the backlog, so only the
  fan-out's join (released when the map's last task ends, nothing else queued) and the chains at
  rest measure the release itself;
- **exactly once**: every task completed with one run, every workflow completed.

A ratio is the workflow side's figure over the plain side's of the same round (the baseline pair:
this checkout's over the baseline's). The progress line of each drain goes to standard error,
the figures and the summary table (markdown) to standard output. Exit status 1 when a drain did
not run every task exactly once or every workflow to completion.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

import benchmarks.bench_handler  # noqa: F401  # registers bench.*, whose payloads the in-process facade checks
import taskmesh
from benchmarks.bench import REDIS_NAMES, database_name, worker_processes
from benchmarks.measure import BackendCpu, cpu_by_name, cpu_of_tree, cpu_since, pct, with_db
from taskmesh.clients.client import Client
from taskmesh.workflows.spec import MAP_MAX_ITEMS, WorkflowLimits, parse_workflow
from taskmesh.workflows.workflows import Workflows

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: the instances import ``benchmarks.bench_handler`` from it."""
DATABASE = "taskmesh_wfbench"
BASELINE = "1c898d0"
"""The commit before workflows (``refactor(entry)``), whose plain drain the pair compares with."""
CHAIN_BATCH = 1000
"""Chains per ``Workflows.submit_many`` (one transaction each), as plain tasks are enqueued 1,000 a call."""
POLL_SECONDS = 0.05
JOIN_DELAY_SQL = """
SELECT n.workflow_id, n.node_id, w.name,
       extract(epoch FROM r.started_at - d.last) * 1000 AS ms
FROM workflow_nodes n
JOIN workflows w ON w.id = n.workflow_id
JOIN tasks t ON t.workflow_id = n.workflow_id AND t.workflow_node = n.node_id
JOIN task_runs r ON r.task_id = t.id AND r.attempt = 1
CROSS JOIN LATERAL (
    SELECT max(dr.finished_at) AS last
    FROM tasks dt JOIN task_runs dr ON dr.task_id = dt.id
    WHERE dt.workflow_id = n.workflow_id AND dt.workflow_node = ANY(n.deps)
) d
WHERE n.kind = 'task' AND cardinality(n.deps) > 0
"""
"""Each join's delay in ms: its run's start after its deps' last run's end (PostgreSQL's clock both)."""
ROOT_PICKUP_SQL = """
SELECT extract(epoch FROM r.started_at - t.created_at) * 1000 AS ms
FROM tasks t JOIN workflows w ON w.id = t.workflow_id JOIN task_runs r ON r.task_id = t.id AND r.attempt = 1
WHERE w.name = $1 AND t.workflow_node = 'a'
"""
"""The pickup of each chain's root in ms, from its creation (the submission's transaction) to its run's start:
the path of any enqueued task (commit, push, pop, claim), for scale beside the join delays of the same moments."""


def fanout_body(n: int) -> dict[str, Any]:
    """A root returning ``n`` items, a map over them, a join after the map."""
    return {
        "name": "bench.fanout",
        "nodes": [
            {"id": "root", "task": "bench.fanout", "payload": {"n": n}},
            {"id": "map", "task": "bench.empty", "deps": ["root"], "map": {"from": "root"}},
            {"id": "join", "task": "bench.empty", "deps": ["map"]},
        ],
    }


def chain_body(name: str = "bench.chain") -> dict[str, Any]:
    """``a -> b -> c``, each a task of a handler that does nothing."""
    return {
        "name": name,
        "nodes": [
            {"id": "a", "task": "bench.empty"},
            {"id": "b", "task": "bench.empty", "deps": ["a"]},
            {"id": "c", "task": "bench.empty", "deps": ["b"]},
        ],
    }


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
    joins_ms: list[float] = field(default_factory=list)

    @property
    def drain_per_s(self) -> float:
        """Tasks over the span of their runs."""
        return self.tasks / self.span_s if self.span_s > 0 else 0.0

    @property
    def end_to_end_per_s(self) -> float:
        """Tasks over the store time plus the span of their runs."""
        return self.tasks / (self.store_s + self.span_s) if self.store_s + self.span_s > 0 else 0.0

    def line(self) -> str:
        """The drain's figures on one line."""
        return (
            f"  {self.label:<30} {self.tasks:>7,} tasks: store {self.store_s:6.2f} s, "
            f"drain {self.drain_per_s:7,.0f} tasks/s ({self.span_s:.2f} s; from launch {self.launch_s:.2f} s), "
            f"end to end {self.end_to_end_per_s:7,.0f} tasks/s; "
            f"CPU/task instance {self.instance_cpu_us:.0f} us, postgres {self.postgres_cpu_us:.0f} us, "
            f"redis {self.redis_cpu_us:.0f} us; exactly once {'yes' if self.exactly_once else 'NO'} ({self.detail})"
        )


@dataclass
class Round:
    """The drains of one round, by pair and side."""

    plain_fanout: Drain | None = None
    fanout: Drain | None = None
    plain_chains: Drain | None = None
    chains: Drain | None = None
    baseline: Drain | None = None
    current: Drain | None = None

    def drains(self) -> list[Drain]:
        """Every drain run, in no particular order."""
        found = [
            self.plain_fanout,
            self.fanout,
            self.plain_chains,
            self.chains,
            self.baseline,
            self.current,
        ]
        return [d for d in found if d is not None]


class WorkflowBench:
    """One run of the benchmark (see the module docs)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.admin_url = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
        self.redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        self.database: str = args.database
        self.db_url = with_db(self.admin_url, self.database)
        self.prefix = self.database
        self.current = Side("this checkout", Path(taskmesh.__file__).resolve().parents[1], f"{self.database}_tpl")
        self.baseline: Side | None = None
        self.rounds: list[Round] = []
        self.rest_ms: list[float] = []
        self.rest_pickup_ms: list[float] = []

    # -- databases and instances ---------------------------------------------------

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

    def start_instance(self, side: Side) -> subprocess.Popen[bytes]:
        """``python -m taskmesh`` of the side's code on the database, without HTTP."""
        env = {
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
        if self.args.fanout > MAP_MAX_ITEMS and side is self.current:
            env["TASKMESH_WORKFLOW_MAP_MAX_ITEMS"] = str(self.args.fanout)
        return subprocess.Popen([sys.executable, "-m", "taskmesh"], env=env, stdout=subprocess.DEVNULL)

    @staticmethod
    def stop_instance(proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM, then SIGKILL after 40 s."""
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def client(self, pool_size: int = 4) -> Client:
        """A client of the database, for ``async with``."""
        return Client(self.db_url, self.redis_url, redis_prefix=self.prefix, pool_size=pool_size)

    def limits(self) -> WorkflowLimits:
        """The workflow bounds, wide enough for ``--fanout``."""
        return WorkflowLimits(map_max_items=max(MAP_MAX_ITEMS, self.args.fanout))

    # -- the drains ----------------------------------------------------------------

    async def plain(self, side: Side, n: int, label: str) -> Drain:
        """``n`` plain tasks enqueued by the side's client, then drained by the side's instance."""
        await self.fresh(side)
        store = self.fill(side, "enqueue", self.db_url, self.redis_url, self.prefix, str(n), "bench.empty")
        return await self.drain(side, Drain(label, n, store), workflows=0)

    async def fanout(self) -> Drain:
        """The fan-out workflow submitted, then drained."""
        n = self.args.fanout
        await self.fresh(self.current)
        async with self.client() as client:
            flows = Workflows(client.tasks, self.limits())
            spec = parse_workflow(fanout_body(n), self.limits())
            t0 = time.perf_counter()
            await flows.submit(spec)
            store = time.perf_counter() - t0
        return await self.drain(self.current, Drain(f"fan-out 1 -> {n:,} -> 1", n + 2, store), workflows=1)

    async def chains(self) -> Drain:
        """``--chains`` chains submitted ``CHAIN_BATCH`` at a time (one transaction per batch), then drained."""
        n = self.args.chains
        await self.fresh(self.current)
        spec = parse_workflow(chain_body())
        async with self.client() as client:
            flows = Workflows(client.tasks)
            t0 = time.perf_counter()
            for start in range(0, n, CHAIN_BATCH):
                await flows.submit_many([spec] * min(CHAIN_BATCH, n - start))
            store = time.perf_counter() - t0
        return await self.drain(self.current, Drain(f"chains {n:,} x a -> b -> c", 3 * n, store), workflows=n)

    async def drain(self, side: Side, d: Drain, workflows: int) -> Drain:
        """Launch the side's instance and wait until every task ended; fill in ``d``'s figures.

        :raises RuntimeError: the instance exited, a task failed, or the drain outlasted ``--timeout``.
        """
        admin = await asyncpg.connect(self.admin_url)
        watch = await asyncpg.connect(self.db_url)
        backends = BackendCpu(admin, self.database, exclude={watch.get_server_pid()})
        try:
            await backends.start()
            rd0 = cpu_by_name(REDIS_NAMES)
            t0 = time.perf_counter()
            proc = self.start_instance(side)
            try:
                polled = 0.0
                while not await _ended(watch, d.tasks):
                    if proc.poll() is not None:
                        raise RuntimeError(f"{d.label}: the instance exited with {proc.returncode}")
                    if time.perf_counter() - t0 > self.args.timeout:
                        raise RuntimeError(f"{d.label}: not over in {self.args.timeout} s ({await _statuses(watch)})")
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
            await _check(watch, d, workflows)
            if workflows:
                d.joins_ms = [float(r["ms"]) for r in await watch.fetch(JOIN_DELAY_SQL)]
        finally:
            await watch.close()
            await admin.close()
        print(d.line(), file=sys.stderr)
        return d

    async def rest(self) -> None:
        """Chains one by one at ``--rest-rate`` to a warm, idle instance: the join delays at rest."""
        n, rate = self.args.rest_chains, self.args.rest_rate
        await self.fresh(self.current)
        proc = self.start_instance(self.current)
        try:
            async with self.client() as client:
                flows = Workflows(client.tasks)
                await flows.submit(parse_workflow(chain_body("bench.warmup")))
                await self._until(proc, "SELECT count(*) = 1 FROM workflows WHERE finished_at IS NOT NULL", 60)
                await asyncio.sleep(0.5)
                spec = parse_workflow(chain_body("bench.rest"))
                t0 = time.perf_counter()
                for i in range(n):
                    await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
                    await flows.submit(spec)
            await self._until(proc, f"SELECT count(*) = {n + 1} FROM workflows WHERE finished_at IS NOT NULL", 60)
            watch = await asyncpg.connect(self.db_url)
            try:
                rows = await watch.fetch(JOIN_DELAY_SQL)
                pickups = await watch.fetch(ROOT_PICKUP_SQL, "bench.rest")
                d = Drain("at rest", 3 * n + 3, 0.0)
                await _check(watch, d, n + 1)
                if not d.exactly_once:
                    raise RuntimeError(f"at rest: not every task ran exactly once ({d.detail})")
            finally:
                await watch.close()
        finally:
            self.stop_instance(proc)
        self.rest_ms = [float(r["ms"]) for r in rows if r["name"] == "bench.rest"]
        self.rest_pickup_ms = [float(r["ms"]) for r in pickups]

    async def _plain_baseline(self) -> Drain:
        assert self.baseline is not None
        n = self.args.baseline_tasks
        return await self.plain(self.baseline, n, f"plain {n:,} on {self.baseline.name}")

    async def _plain_current(self) -> Drain:
        n = self.args.baseline_tasks
        return await self.plain(self.current, n, f"plain {n:,} on this checkout")

    async def _until(self, proc: subprocess.Popen[bytes], sql: str, within: float) -> None:
        conn = await asyncpg.connect(self.db_url)
        try:
            deadline = time.monotonic() + within
            while not await conn.fetchval(sql):
                if proc.poll() is not None:
                    raise RuntimeError(f"at rest: the instance exited with {proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"at rest: not over in {within} s ({await _statuses(conn)})")
                await asyncio.sleep(POLL_SECONDS)
        finally:
            await conn.close()

    # -- the run -------------------------------------------------------------------

    async def run(self) -> None:
        """Every round, then the figures at rest."""
        await self.prepare(self.current)
        if self.args.baseline != "none" and self.args.rounds:
            self.baseline = Side(self.args.baseline, export_baseline(self.args.baseline), f"{self.database}_btpl")
            await self.prepare(self.baseline)
        try:
            for i in range(self.args.rounds):
                print(f"round {i + 1}", file=sys.stderr)
                r = Round()
                first_plain = i % 2 == 0
                r.plain_fanout, r.fanout = await _pair(
                    first_plain,
                    lambda: self.plain(self.current, self.args.fanout + 2, f"plain {self.args.fanout + 2:,}"),
                    self.fanout,
                )
                if self.args.chains:
                    r.plain_chains, r.chains = await _pair(
                        first_plain,
                        lambda: self.plain(self.current, 3 * self.args.chains, f"plain {3 * self.args.chains:,}"),
                        self.chains,
                    )
                if self.baseline is not None:
                    r.baseline, r.current = await _pair(first_plain, self._plain_baseline, self._plain_current)
                self.rounds.append(r)
            if self.args.rest_chains:
                await self.rest()
        finally:
            await self.drop_templates()


async def _pair(
    first_plain: bool, plain: Callable[[], Awaitable[Drain]], other: Callable[[], Awaitable[Drain]]
) -> tuple[Drain, Drain]:
    """Run the two sides of a pair, the plain one first when ``first_plain``; returns (plain, other)."""
    if first_plain:
        a = await plain()
        return a, await other()
    b = await other()
    return await plain(), b


async def _ended(conn: asyncpg.Connection, n: int) -> bool:
    """Whether the database holds ``n`` tasks, none of them not completed.

    :raises RuntimeError: a task failed, was cancelled or skipped.
    """
    row = await _one(
        conn,
        "SELECT EXISTS (SELECT 1 FROM tasks WHERE status <> 'completed') AS open,"
        " EXISTS (SELECT 1 FROM tasks WHERE status IN ('failed', 'cancelled', 'skipped')) AS bad",
    )
    if row["bad"]:
        raise RuntimeError(f"a task did not complete ({await _statuses(conn)})")
    return not row["open"] and await conn.fetchval("SELECT count(*) FROM tasks") == n


async def _one(conn: asyncpg.Connection, sql: str) -> asyncpg.Record:
    row = await conn.fetchrow(sql)
    assert row is not None  # a SELECT without FROM returns one row
    return row


async def _statuses(conn: asyncpg.Connection) -> str:
    rows = await conn.fetch("SELECT status, count(*) AS n FROM tasks GROUP BY status ORDER BY status")
    return ", ".join(f"{r['status']} {r['n']}" for r in rows) or "no tasks"


async def _check(conn: asyncpg.Connection, d: Drain, workflows: int) -> None:
    """Every task completed with one run; with ``workflows``, that many workflows, all completed."""
    row = await _one(
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


def _each(values: list[str], between: str = " / ") -> str:
    return between.join(values) if values else "-"


def _ms(values: list[float]) -> str:
    return f"{pct(values, 0.5):.1f} / {pct(values, 0.99):.1f}" if values else "-"


def _met(ratios: list[float], goal: float) -> str:
    met = sum(1 for r in ratios if r >= goal)
    return "yes" if met == len(ratios) else ("no" if not met else f"{met} of {len(ratios)} rounds")


def table(bench: WorkflowBench) -> list[str]:
    """The summary in markdown: one row per figure, each round's value in turn (``r1 / r2``)."""
    rounds = bench.rounds
    rows = ["| figure | measured | against | ratio | goal | met |", "| --- | --- | --- | --- | --- | --- |"]

    def rate_rows(label: str, mine: list[Drain], theirs: list[Drain], what: str) -> None:
        for kind in ("drain", "end to end"):
            ours = [d.drain_per_s if kind == "drain" else d.end_to_end_per_s for d in mine]
            plain = [d.drain_per_s if kind == "drain" else d.end_to_end_per_s for d in theirs]
            ratios = [a / b for a, b in zip(ours, plain, strict=True)]
            rows.append(
                f"| {label}, {kind}, tasks/s | {_each([f'{v:,.0f}' for v in ours])} "
                f"| {_each([f'{v:,.0f}' for v in plain])} {what} | {_each([f'{r:.2f}x' for r in ratios])} "
                f"| ≥ 0.8x | {_met(ratios, 0.8)} |"
            )
        cpu = [f"{d.instance_cpu_us:.0f} + {d.postgres_cpu_us:.0f}" for d in mine]
        cpu_theirs = [f"{d.instance_cpu_us:.0f} + {d.postgres_cpu_us:.0f}" for d in theirs]
        rows.append(f"| {label}, CPU per task, instance + PostgreSQL, µs | {_each(cpu)} | {_each(cpu_theirs)} | | | |")

    fan = [r.fanout for r in rounds if r.fanout]
    plain_fan = [r.plain_fanout for r in rounds if r.plain_fanout]
    if fan:
        rate_rows(f"fan-out 1 → {bench.args.fanout:,} → 1", fan, plain_fan, f"({plain_fan[0].tasks:,} plain)")
    chains = [r.chains for r in rounds if r.chains]
    plain_chains = [r.plain_chains for r in rounds if r.plain_chains]
    if chains:
        rate_rows(f"{bench.args.chains:,} chains a → b → c", chains, plain_chains, f"({plain_chains[0].tasks:,} plain)")
    if bench.rest_ms:
        met = "yes" if pct(bench.rest_ms, 0.99) < 50 else "no"
        rows.append(
            f"| join delay at rest, p50 / p99, ms ({len(bench.rest_ms)} steps b and c of {bench.args.rest_chains} "
            f"chains at {bench.args.rest_rate}/s) | {_ms(bench.rest_ms)} | {_ms(bench.rest_pickup_ms)} (the roots' "
            f"pickup) | | p99 < 50 | {met} |"
        )
    if fan:
        joins = [d.joins_ms[0] for d in fan if d.joins_ms]
        rows.append(
            f"| fan-in join delay after the map's last task, ms | {_each([f'{j:.1f}' for j in joins])} | | | < 50 "
            f"| {_met([-j for j in joins], -50)} |"
        )
    if chains:
        rows.append(
            f"| chain steps' delay in the drain (behind its backlog), p50 / p99, ms "
            f"| {_each([_ms(d.joins_ms) for d in chains], '; ')} | | | | |"
        )
    current = [r.current for r in rounds if r.current]
    baseline = [r.baseline for r in rounds if r.baseline]
    if current and bench.baseline:
        ratios = [a.drain_per_s / b.drain_per_s for a, b in zip(current, baseline, strict=True)]
        rates = _each([f"{d.drain_per_s:,.0f}" for d in current])
        rates_base = _each([f"{d.drain_per_s:,.0f}" for d in baseline])
        rows.append(
            f"| plain drain ({current[0].tasks:,} tasks), this checkout against {bench.baseline.name}, tasks/s "
            f"| {rates} | {rates_base} | {_each([f'{r:.2f}x' for r in ratios])} | ≈ 1.0x | |"
        )
        cpu = [f"{d.instance_cpu_us:.0f} + {d.postgres_cpu_us:.0f}" for d in current]
        cpu_base = [f"{d.instance_cpu_us:.0f} + {d.postgres_cpu_us:.0f}" for d in baseline]
        totals = [
            (a.instance_cpu_us + a.postgres_cpu_us) / (b.instance_cpu_us + b.postgres_cpu_us)
            for a, b in zip(current, baseline, strict=True)
        ]
        rows.append(
            f"| plain drain, CPU per task, instance + PostgreSQL, µs | {_each(cpu)} | {_each(cpu_base)} "
            f"| {_each([f'{r:.2f}x' for r in totals])} | ≈ 1.0x | |"
        )
    return rows


def print_report(bench: WorkflowBench) -> None:
    """Every drain's figures by round, then the summary table."""
    a = bench.args
    print(
        f"\ntaskmesh workflows bench: {a.rounds} round(s), one instance (concurrency {a.concurrency}, prefetch "
        f"{a.prefetch}, worker_processes {a.worker_processes}), {os.cpu_count()} cores, handlers that do nothing"
    )
    for i, r in enumerate(bench.rounds):
        print(f"round {i + 1}")
        for d in r.drains():
            print(d.line())
    if bench.rest_ms:
        print(
            f"at rest: {a.rest_chains} chains at {a.rest_rate}/s, join delay p50 {pct(bench.rest_ms, 0.5):.1f} / "
            f"p95 {pct(bench.rest_ms, 0.95):.1f} / p99 {pct(bench.rest_ms, 0.99):.1f} / "
            f"max {max(bench.rest_ms):.1f} ms; "
            f"the roots' pickup p50 {pct(bench.rest_pickup_ms, 0.5):.1f} / p99 {pct(bench.rest_pickup_ms, 0.99):.1f} ms"
        )
    print()
    for row in table(bench):
        print(row)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1, not {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.workflows``; returns the exit status (1: a drain was not exactly once)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.workflows",
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--fanout", type=_positive, default=10_000, help="the map node's tasks of the fan-out")
    parser.add_argument("--chains", type=_count, default=5_000, help="a -> b -> c workflows (0: skip the pair)")
    parser.add_argument(
        "--baseline", default=BASELINE, help="the commit whose plain drain this checkout's is set against (none: skip)"
    )
    parser.add_argument("--baseline-tasks", type=_positive, default=20_000, help="plain tasks of the baseline pair")
    parser.add_argument(
        "--rounds", type=_count, default=2, help="rounds of the three pairs (0: only the phase at rest)"
    )
    parser.add_argument("--rest-chains", type=_count, default=300, help="chains submitted at rest (0: skip)")
    parser.add_argument("--rest-rate", type=_positive, default=20, help="chains per second at rest")
    parser.add_argument("--concurrency", type=_positive, default=32, help="the instance's executors")
    parser.add_argument("--prefetch", type=_positive, default=128, help="tasks claimed ahead (the prefetch setting)")
    parser.add_argument("--worker-processes", type=worker_processes, default=1, help="the instance's worker_processes")
    parser.add_argument("--timeout", type=_positive, default=600, help="seconds a drain may take before the run fails")
    parser.add_argument(
        "--database",
        type=database_name,
        default=DATABASE,
        help="the database the benchmark DROPS (with FORCE) and creates, with <database>_tpl and _btpl; also "
        "the Redis key prefix",
    )
    args = parser.parse_args(argv)
    compileall.compile_dir(Path(taskmesh.__file__).parent, quiet=1)
    compileall.compile_dir(ROOT / "benchmarks", quiet=1)
    bench = WorkflowBench(args)
    asyncio.run(bench.run())
    print_report(bench)
    ok = all(d.exactly_once for r in bench.rounds for d in r.drains())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
