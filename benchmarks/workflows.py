"""``python -m benchmarks.workflows``: what running tasks as a workflow costs, beside plain tasks in the same run.

Run it from the repository root (``make bench-workflows``; a quick look:
``make bench-workflows ARGS="--fanout 500 --chains 200 --baseline-tasks 2000 --rounds 1"``); it is not
part of the installed package. Stores as ``benchmarks.bench``: the PostgreSQL of ``DATABASE_URL``
(default ``postgresql://postgres@127.0.0.1:5432/postgres``; the role must be allowed to create
databases), where it drops and creates the database ``--database`` (``taskmesh_wfbench``) and two
templates beside it (``<database>_tpl`` and ``<database>_btpl``, dropped at the end), and the Redis
of ``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``), keys under the prefix ``<database>:``. The
sides, the drains and their figures are the harness of ``benchmarks.drains``, which
``benchmarks.limits`` runs too.

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
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

import benchmarks.bench_handler  # noqa: F401  # registers bench.*, whose payloads the in-process facade checks
from benchmarks.bench import byte_compile
from benchmarks.drains import (
    POLL_SECONDS,
    Drain,
    DrainBench,
    Side,
    add_instance_arguments,
    check,
    count,
    each,
    met,
    pair,
    positive,
    statuses,
)
from benchmarks.measure import pct
from taskmesh.workflows.spec import MAP_MAX_ITEMS, WorkflowLimits, parse_workflow
from taskmesh.workflows.workflows import Workflows

DATABASE = "taskmesh_wfbench"
BASELINE = "1c898d0"
"""The commit before workflows (``refactor(entry)``), whose plain drain the pair compares with."""
CHAIN_BATCH = 1000
"""Chains per ``Workflows.submit_many`` (one transaction each), as plain tasks are enqueued 1,000 a call."""
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


@dataclass
class FlowDrain(Drain):
    """A drain of workflows: also each join's delay, ms (see the module docs)."""

    joins_ms: list[float] = field(default_factory=list)


@dataclass
class Round:
    """The drains of one round, by pair and side."""

    plain_fanout: Drain | None = None
    fanout: FlowDrain | None = None
    plain_chains: Drain | None = None
    chains: FlowDrain | None = None
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


class WorkflowBench(DrainBench):
    """One run of the benchmark (see the module docs)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.rounds: list[Round] = []
        self.rest_ms: list[float] = []
        self.rest_pickup_ms: list[float] = []

    def instance_env(self, side: Side) -> dict[str, str]:
        """The harness's environment, with a map bound wide enough for ``--fanout`` on this checkout."""
        env = super().instance_env(side)
        if self.args.fanout > MAP_MAX_ITEMS and side is self.current:
            env["TASKMESH_WORKFLOW_MAP_MAX_ITEMS"] = str(self.args.fanout)
        return env

    def limits(self) -> WorkflowLimits:
        """The workflow bounds, wide enough for ``--fanout``."""
        return WorkflowLimits(map_max_items=max(MAP_MAX_ITEMS, self.args.fanout))

    # -- the drains ----------------------------------------------------------------

    async def fanout(self) -> FlowDrain:
        """The fan-out workflow submitted, then drained."""
        n = self.args.fanout
        await self.fresh(self.current)
        async with self.client() as client:
            flows = Workflows(client.tasks, self.limits())
            spec = parse_workflow(fanout_body(n), self.limits())
            t0 = time.perf_counter()
            await flows.submit(spec)
            store = time.perf_counter() - t0
        return await self.drain(
            self.current, FlowDrain(f"fan-out 1 -> {n:,} -> 1", n + 2, store), workflows=1, after=_joins
        )

    async def chains(self) -> FlowDrain:
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
        label = f"chains {n:,} x a -> b -> c"
        return await self.drain(self.current, FlowDrain(label, 3 * n, store), workflows=n, after=_joins)

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
                await check(watch, d, n + 1)
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
                    raise RuntimeError(f"at rest: not over in {within} s ({await statuses(conn)})")
                await asyncio.sleep(POLL_SECONDS)
        finally:
            await conn.close()

    # -- the run -------------------------------------------------------------------

    async def run(self) -> None:
        """Every round, then the figures at rest."""
        await self.prepare(self.current)
        if self.args.baseline != "none" and self.args.rounds:
            await self.prepare_baseline(self.args.baseline)
        try:
            for i in range(self.args.rounds):
                print(f"round {i + 1}", file=sys.stderr)
                r = Round()
                first_plain = i % 2 == 0
                r.plain_fanout, r.fanout = await pair(
                    first_plain,
                    lambda: self.plain(self.current, self.args.fanout + 2, f"plain {self.args.fanout + 2:,}"),
                    self.fanout,
                )
                if self.args.chains:
                    r.plain_chains, r.chains = await pair(
                        first_plain,
                        lambda: self.plain(self.current, 3 * self.args.chains, f"plain {3 * self.args.chains:,}"),
                        self.chains,
                    )
                if self.baseline is not None:
                    r.baseline, r.current = await pair(first_plain, self._plain_baseline, self._plain_current)
                self.rounds.append(r)
            if self.args.rest_chains:
                await self.rest()
        finally:
            await self.drop_templates()


async def _joins(watch: asyncpg.Connection, d: FlowDrain) -> None:
    """Each join's delay in the drained database (:data:`JOIN_DELAY_SQL`)."""
    d.joins_ms = [float(r["ms"]) for r in await watch.fetch(JOIN_DELAY_SQL)]


# -- the report ------------------------------------------------------------------


def _ms(values: list[float]) -> str:
    return f"{pct(values, 0.5):.1f} / {pct(values, 0.99):.1f}" if values else "-"


def table(bench: WorkflowBench) -> list[str]:
    """The summary in markdown: one row per figure, each round's value in turn (``r1 / r2``)."""
    rounds = bench.rounds
    rows = ["| figure | measured | against | ratio | goal | met |", "| --- | --- | --- | --- | --- | --- |"]

    def rate_rows(label: str, mine: Sequence[Drain], theirs: Sequence[Drain], what: str) -> None:
        for kind in ("drain", "end to end"):
            ours = [d.drain_per_s if kind == "drain" else d.end_to_end_per_s for d in mine]
            plain = [d.drain_per_s if kind == "drain" else d.end_to_end_per_s for d in theirs]
            ratios = [a / b for a, b in zip(ours, plain, strict=True)]
            rows.append(
                f"| {label}, {kind}, tasks/s | {each([f'{v:,.0f}' for v in ours])} "
                f"| {each([f'{v:,.0f}' for v in plain])} {what} | {each([f'{r:.2f}x' for r in ratios])} "
                f"| ≥ 0.8x | {met(ratios, 0.8)} |"
            )
        cpu = [f"{d.instance_cpu_us:.0f} + {d.postgres_cpu_us:.0f}" for d in mine]
        cpu_theirs = [f"{d.instance_cpu_us:.0f} + {d.postgres_cpu_us:.0f}" for d in theirs]
        rows.append(f"| {label}, CPU per task, instance + PostgreSQL, µs | {each(cpu)} | {each(cpu_theirs)} | | | |")

    fan = [r.fanout for r in rounds if r.fanout]
    plain_fan = [r.plain_fanout for r in rounds if r.plain_fanout]
    if fan:
        rate_rows(f"fan-out 1 → {bench.args.fanout:,} → 1", fan, plain_fan, f"({plain_fan[0].tasks:,} plain)")
    chains = [r.chains for r in rounds if r.chains]
    plain_chains = [r.plain_chains for r in rounds if r.plain_chains]
    if chains:
        rate_rows(f"{bench.args.chains:,} chains a → b → c", chains, plain_chains, f"({plain_chains[0].tasks:,} plain)")
    if bench.rest_ms:
        held = "yes" if pct(bench.rest_ms, 0.99) < 50 else "no"
        rows.append(
            f"| join delay at rest, p50 / p99, ms ({len(bench.rest_ms)} steps b and c of {bench.args.rest_chains} "
            f"chains at {bench.args.rest_rate}/s) | {_ms(bench.rest_ms)} | {_ms(bench.rest_pickup_ms)} (the roots' "
            f"pickup) | | p99 < 50 | {held} |"
        )
    if fan:
        joins = [d.joins_ms[0] for d in fan if d.joins_ms]
        rows.append(
            f"| fan-in join delay after the map's last task, ms | {each([f'{j:.1f}' for j in joins])} | | | < 50 "
            f"| {met([-j for j in joins], -50)} |"
        )
    if chains:
        rows.append(
            f"| chain steps' delay in the drain (behind its backlog), p50 / p99, ms "
            f"| {each([_ms(d.joins_ms) for d in chains], '; ')} | | | | |"
        )
    current = [r.current for r in rounds if r.current]
    baseline = [r.baseline for r in rounds if r.baseline]
    if current and bench.baseline:
        ratios = [a.drain_per_s / b.drain_per_s for a, b in zip(current, baseline, strict=True)]
        rates = each([f"{d.drain_per_s:,.0f}" for d in current])
        rates_base = each([f"{d.drain_per_s:,.0f}" for d in baseline])
        rows.append(
            f"| plain drain ({current[0].tasks:,} tasks), this checkout against {bench.baseline.name}, tasks/s "
            f"| {rates} | {rates_base} | {each([f'{r:.2f}x' for r in ratios])} | ≈ 1.0x | |"
        )
        cpu = [f"{d.instance_cpu_us:.0f} + {d.postgres_cpu_us:.0f}" for d in current]
        cpu_base = [f"{d.instance_cpu_us:.0f} + {d.postgres_cpu_us:.0f}" for d in baseline]
        totals = [
            (a.instance_cpu_us + a.postgres_cpu_us) / (b.instance_cpu_us + b.postgres_cpu_us)
            for a, b in zip(current, baseline, strict=True)
        ]
        rows.append(
            f"| plain drain, CPU per task, instance + PostgreSQL, µs | {each(cpu)} | {each(cpu_base)} "
            f"| {each([f'{r:.2f}x' for r in totals])} | ≈ 1.0x | |"
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.workflows``; returns the exit status (1: a drain was not exactly once)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.workflows",
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--fanout", type=positive, default=10_000, help="the map node's tasks of the fan-out")
    parser.add_argument("--chains", type=count, default=5_000, help="a -> b -> c workflows (0: skip the pair)")
    parser.add_argument(
        "--baseline", default=BASELINE, help="the commit whose plain drain this checkout's is set against (none: skip)"
    )
    parser.add_argument("--baseline-tasks", type=positive, default=20_000, help="plain tasks of the baseline pair")
    parser.add_argument("--rounds", type=count, default=2, help="rounds of the three pairs (0: only the phase at rest)")
    parser.add_argument("--rest-chains", type=count, default=300, help="chains submitted at rest (0: skip)")
    parser.add_argument("--rest-rate", type=positive, default=20, help="chains per second at rest")
    add_instance_arguments(parser, DATABASE)
    args = parser.parse_args(argv)
    byte_compile()
    bench = WorkflowBench(args)
    asyncio.run(bench.run())
    print_report(bench)
    ok = all(d.exactly_once for r in bench.rounds for d in r.drains())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
