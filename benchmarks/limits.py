"""``python -m benchmarks.limits``: what flow control costs a drain, beside the same drain without it.

Run it from the repository root (``make bench-limits``; a quick look:
``make bench-limits ARGS="--tasks 2000 --rounds 1"``); it is not part of the installed package. Stores
and drains as ``benchmarks.workflows`` (the harness of ``benchmarks.drains``): the PostgreSQL of
``DATABASE_URL``, where it drops and creates the database ``--database`` (``taskmesh_limbench``) and
two templates beside it (dropped at the end), and the Redis of ``REDIS_URL``, keys under the prefix
``<database>:``. Every drain runs on a fresh copy of a migrated template with a fresh instance (one
process, ``--concurrency`` executors, ``--prefetch``), launched once its tasks are stored, until every
task has ended; every handler does nothing (``bench.empty``), so what is measured is taskmesh's own
cost, where flow control's share of it is largest.

Each round runs three pairs, the two sides of a pair one after the other, taking turns to go first
(round 1 the side without flow control first, round 2 the other, and so on):

1. **limit = executors**: ``--tasks`` tasks under a limit of the queue whose concurrency is the
   instance's executors (``TASKMESH_LIMITS='{"all": {"queue": "default", "concurrency": <executors>}}'``,
   the client given the same limit, so each task holds the limit key ``all``): every pop goes through the
   admission (``store/lua/limits_admit.lua``) and every end gives its slot back; against the same tasks
   with no limit. Beside each drain, the most runs claimed and not yet written at once (``task_runs``'
   ``started_at`` and ``finished_at``): a slot frees when the handler returns, before the result is
   written, so the limit itself is checked by the tests' ledgers of handler starts and ends, not here.
2. **fairness over ``--keys`` keys**: the same number of tasks spread over ``--keys`` tenants
   (``tenant_id``, in blocks: the first ``tasks / keys`` tasks of the first tenant, and so on) in a queue
   with fair shares (``TASKMESH_QUEUES='{"default": {"concurrency": <concurrency>, "fairness": {"key":
   "tenant_id"}}}'``, the client given the same): each push is scored by its tenant
   (``store/lua/fair_push.lua``); against the same tasks in the same queue without fairness. Beside it,
   how many tenants the first ``--keys`` runs served (fair shares serve one task of each in turn; first
   come, first served only the first few tenants' blocks).
3. **no limit at all**: plain tasks enqueued and drained by the code of ``--baseline`` (default
   ``db4514b``, the commit before flow control; its ``src/`` exported as ``benchmarks.workflows`` does,
   its instance, migrations and enqueue on its own code) against the same by this checkout: the
   admission stage must not slow the common case. ``--baseline none`` skips the pair.

``--pairs`` runs only the pairs it names (``--pairs baseline --rounds 9``: the third pair alone, whose
ratio from one round to the next varies more than the cost it looks for).

Pairs 1 and 2 enqueue through this checkout's ``Client.enqueue_many``, 1,000 a call, in this process
(the store time includes opening the client's pools, as ``benchmarks.plain_fill``'s, which pair 3 uses).

Figures, per drain (``benchmarks.drains``): **drain, tasks/s** over the span from the first run's start
to the last run's end (PostgreSQL's clock), and the time from launch; **end to end, tasks/s**, the
store time added; **CPU per task** of the instance, PostgreSQL's backends of the database and Redis;
**exactly once**: every task completed with one run. A ratio is the flow-controlled side's figure over
the other side's of the same round (pair 3: this checkout's over the baseline's); the summary gives
each round's ratio and their median. The progress line of each drain goes to standard error, the
figures and the summary table (markdown) to standard output. Exit status 1 when a drain did not run
every task exactly once, or the limit did not hold.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from benchmarks.bench import byte_compile
from benchmarks.drains import (
    Drain,
    DrainBench,
    add_instance_arguments,
    count,
    each,
    median,
    met,
    pair,
    positive,
)
from benchmarks.plain_fill import BATCH
from taskmesh.config import usable_cores
from taskmesh.limits.book import LimitBook
from taskmesh.limits.settings import FairnessSettings, LimitSettings

DATABASE = "taskmesh_limbench"
BASELINE = "db4514b"
"""The commit before flow control (the merge of ``client-prefix``), whose plain drain the third pair compares with."""
QUEUE = "default"
LIMIT = "all"
"""The limit of the first pair: every task of :data:`QUEUE`."""
PEAK_SQL = """
SELECT coalesce(max(running), 0) FROM (
    SELECT sum(delta) OVER (ORDER BY at, delta ROWS UNBOUNDED PRECEDING) AS running
    FROM (SELECT started_at AS at, 1 AS delta FROM task_runs WHERE started_at IS NOT NULL
          UNION ALL
          SELECT finished_at, -1 FROM task_runs WHERE finished_at IS NOT NULL) e
) s
"""
"""The most runs open at once (claimed, their result not yet written), from each run's ``started_at`` (+1) and
``finished_at`` (-1); at the same instant an end counts before a start. It counts the executors' runs, the
prefetched ones and those whose result waits to be written: a limit's slot frees when the handler returns,
before its result is written, so with a limit this is above the limit by the results in the committer's
hands (the limit itself is checked by the tests' ledgers of handler starts and ends, not here)."""
FIRST_TENANTS_SQL = """
SELECT count(DISTINCT tenant_id) FROM (
    SELECT t.tenant_id FROM task_runs r JOIN tasks t ON t.id = r.task_id ORDER BY r.started_at, r.id LIMIT $1
) f
"""
"""How many tenants the first ``$1`` runs (by ``started_at``) served."""


@dataclass
class LimitsDrain(Drain):
    """A drain of this benchmark: also the most runs at once, and with ``keys``, the tenants its first runs served."""

    keys: int = 0
    """Tenants the tasks are spread over (0: none has a tenant)."""
    peak_running: int = 0
    first_tenants: int = 0

    def line(self) -> str:
        """The drain's figures on one line."""
        more = f"; at most {self.peak_running} runs open at once"
        if self.keys:
            more += f"; the first {self.keys:,} runs served {self.first_tenants:,} tenants"
        return super().line() + more


@dataclass
class Round:
    """The drains of one round, by pair and side."""

    unlimited: LimitsDrain | None = None
    limited: LimitsDrain | None = None
    unfair: LimitsDrain | None = None
    fair: LimitsDrain | None = None
    baseline: Drain | None = None
    current: Drain | None = None

    def drains(self) -> list[Drain]:
        """Every drain run, in no particular order."""
        found = [self.unlimited, self.limited, self.unfair, self.fair, self.baseline, self.current]
        return [d for d in found if d is not None]


class LimitsBench(DrainBench):
    """One run of the benchmark (see the module docs)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.rounds: list[Round] = []

    @property
    def executors(self) -> int:
        """The instance's executors: ``--concurrency`` in each of its worker processes."""
        processes = self.args.worker_processes
        return int(self.args.concurrency) * (usable_cores() if processes == "auto" else int(processes))

    def limits(self) -> dict[str, dict[str, Any]]:
        """The first pair's limit, as ``TASKMESH_LIMITS`` gives it."""
        return {LIMIT: {"queue": QUEUE, "concurrency": self.executors}}

    def queues(self, fair: bool) -> dict[str, dict[str, Any]]:
        """The second pair's queue, as ``TASKMESH_QUEUES`` gives it: with fair shares by tenant or without."""
        entry: dict[str, Any] = {"concurrency": self.args.concurrency}
        if fair:
            entry["fairness"] = {"key": "tenant_id"}
        return {QUEUE: entry}

    def tasks(self, keys: int) -> list[dict[str, Any]]:
        """``--tasks`` tasks of ``bench.empty``; with ``keys``, spread over as many tenants in blocks."""
        n = self.args.tasks
        if not keys:
            return [{"name": "bench.empty"} for _ in range(n)]
        return [{"name": "bench.empty", "tenant_id": f"tenant-{i * keys // n:04d}"} for i in range(n)]

    async def enqueued(self, label: str, keys: int, book: LimitBook | None, env: dict[str, str]) -> LimitsDrain:
        """The tasks enqueued by this checkout's client holding ``book``, 1,000 a call, then drained by an
        instance with ``env``."""
        await self.fresh(self.current)
        tasks = self.tasks(keys)
        t0 = time.perf_counter()
        async with self.client(limits=book) as client:
            for start in range(0, len(tasks), BATCH):
                await client.enqueue_many(tasks[start : start + BATCH])
        store = time.perf_counter() - t0
        drain = LimitsDrain(label, len(tasks), store, keys=keys)
        return await self.drain(self.current, drain, env=env, after=_shape)

    async def unlimited(self) -> LimitsDrain:
        """The first pair's side without a limit."""
        return await self.enqueued("no limit", 0, None, {})

    async def limited(self) -> LimitsDrain:
        """The first pair's side under the limit of the queue, concurrency = executors."""
        limits = self.limits()
        book = LimitBook({name: LimitSettings.model_validate(s) for name, s in limits.items()})
        env = {"TASKMESH_LIMITS": json.dumps(limits)}
        return await self.enqueued(f"limit = executors ({self.executors})", 0, book, env)

    async def unfair(self) -> LimitsDrain:
        """The second pair's side without fairness: the same tenants' tasks, first come, first served."""
        env = {"TASKMESH_QUEUES": json.dumps(self.queues(fair=False))}
        return await self.enqueued(f"{self.args.keys:,} tenants, no fairness", self.args.keys, None, env)

    async def fair(self) -> LimitsDrain:
        """The second pair's side with fair shares between the tenants."""
        queues = self.queues(fair=True)
        book = LimitBook(fairness={q: FairnessSettings.model_validate(e["fairness"]) for q, e in queues.items()})
        env = {"TASKMESH_QUEUES": json.dumps(queues)}
        return await self.enqueued(f"{self.args.keys:,} tenants, fairness", self.args.keys, book, env)

    async def _plain_baseline(self) -> Drain:
        assert self.baseline is not None
        return await self.plain(self.baseline, self.args.tasks, f"no limit, {self.baseline.name}")

    async def _plain_current(self) -> Drain:
        return await self.plain(self.current, self.args.tasks, "no limit, this checkout")

    async def run(self) -> None:
        """Every round: the limit pair, the fairness pair, the baseline pair (those of ``--pairs``)."""
        await self.prepare(self.current)
        if self.args.baseline != "none" and "baseline" in self.args.pairs:
            await self.prepare_baseline(self.args.baseline)
        try:
            for i in range(self.args.rounds):
                print(f"round {i + 1}", file=sys.stderr)
                r = Round()
                first_plain = i % 2 == 0
                if "limit" in self.args.pairs:
                    r.unlimited, r.limited = await pair(first_plain, self.unlimited, self.limited)
                if "fairness" in self.args.pairs:
                    r.unfair, r.fair = await pair(first_plain, self.unfair, self.fair)
                if self.baseline is not None:
                    r.baseline, r.current = await pair(first_plain, self._plain_baseline, self._plain_current)
                self.rounds.append(r)
        finally:
            await self.drop_templates()


async def _shape(watch: asyncpg.Connection, d: LimitsDrain) -> None:
    """The most runs at once and, with tenants, how many the first runs served (read off the drained database)."""
    d.peak_running = int(await watch.fetchval(PEAK_SQL))
    if d.keys:
        d.first_tenants = int(await watch.fetchval(FIRST_TENANTS_SQL, d.keys))


# -- the report ------------------------------------------------------------------


def rate_rows(label: str, mine: Sequence[Drain], theirs: Sequence[Drain], what: str, goal: float | None) -> list[str]:
    """The rows of one pair: drain and end to end rates, then CPU per task; ratios per round and their median."""
    rows = []
    want = f"≥ {goal}x" if goal is not None else "≈ 1.0x"
    for kind in ("drain", "end to end"):
        ours = [d.drain_per_s if kind == "drain" else d.end_to_end_per_s for d in mine]
        other = [d.drain_per_s if kind == "drain" else d.end_to_end_per_s for d in theirs]
        ratios = [a / b if b else 0.0 for a, b in zip(ours, other, strict=True)]
        rows.append(
            f"| {label}, {kind}, tasks/s | {each([f'{v:,.0f}' for v in ours])} "
            f"| {each([f'{v:,.0f}' for v in other])} {what} | {each([f'{r:.2f}x' for r in ratios])} "
            f"| {median(ratios):.2f}x | {want} | {met(ratios, goal) if goal is not None else ''} |"
        )

    def cpu(d: Drain) -> str:
        return f"{d.instance_cpu_us:.0f} + {d.postgres_cpu_us:.0f} + {d.redis_cpu_us:.0f}"

    totals = [
        (a.cpu_us + a.redis_cpu_us) / (b.cpu_us + b.redis_cpu_us) if b.cpu_us + b.redis_cpu_us else 0.0
        for a, b in zip(mine, theirs, strict=True)
    ]
    rows.append(
        f"| {label}, CPU per task, instance + PostgreSQL + Redis, µs | {each([cpu(d) for d in mine])} "
        f"| {each([cpu(d) for d in theirs])} | {each([f'{r:.2f}x' for r in totals])} | {median(totals):.2f}x | | |"
    )
    return rows


def table(bench: LimitsBench) -> list[str]:
    """The summary in markdown: one row per figure, each round's value in turn (``r1 / r2``), the ratios' median."""
    a, rounds = bench.args, bench.rounds
    rows = [
        "| figure | measured | against | ratio | median | goal | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    limited = [r.limited for r in rounds if r.limited]
    unlimited = [r.unlimited for r in rounds if r.unlimited]
    if limited:
        rows += rate_rows(
            f"limit = executors ({bench.executors}), {a.tasks:,} tasks", limited, unlimited, "(no limit)", 0.9
        )
        peaks = [d.peak_running for d in limited]
        others = [d.peak_running for d in unlimited]
        rows.append(
            f"| most runs claimed and not yet written at once (task_runs) | {each([str(p) for p in peaks])} "
            f"| {each([str(p) for p in others])} (no limit) | | | | |"
        )
    fair = [r.fair for r in rounds if r.fair]
    unfair = [r.unfair for r in rounds if r.unfair]
    if fair:
        rows += rate_rows(f"fairness over {a.keys:,} keys, {a.tasks:,} tasks", fair, unfair, "(no fairness)", 0.85)
        served = [d.first_tenants for d in fair]
        served_unfair = [d.first_tenants for d in unfair]
        rows.append(
            f"| tenants the first {a.keys:,} runs served | {each([f'{s:,}' for s in served])} "
            f"| {each([f'{s:,}' for s in served_unfair])} (no fairness) | | | | |"
        )
    current = [r.current for r in rounds if r.current]
    baseline = [r.baseline for r in rounds if r.baseline]
    if current and bench.baseline:
        rows += rate_rows(
            f"no limit, {a.tasks:,} tasks, this checkout against {bench.baseline.name}",
            current,
            baseline,
            f"({bench.baseline.name})",
            None,
        )
    return rows


def print_report(bench: LimitsBench) -> None:
    """Every drain's figures by round, then the summary table."""
    a = bench.args
    print(
        f"\ntaskmesh flow control bench: {len(bench.rounds)} round(s), one instance (concurrency {a.concurrency}, "
        f"prefetch {a.prefetch}, worker_processes {a.worker_processes}), {os.cpu_count()} cores, handlers that do "
        f"nothing"
    )
    for i, r in enumerate(bench.rounds):
        print(f"round {i + 1}")
        for d in r.drains():
            print(d.line())
    print()
    for row in table(bench):
        print(row)


PAIRS = ("limit", "fairness", "baseline")
"""The pairs of a round, in the order they run (see the module docs)."""


def pairs(text: str) -> tuple[str, ...]:
    """An argument naming some of :data:`PAIRS`, comma-separated (``baseline``, ``limit,fairness``).

    :raises argparse.ArgumentTypeError: it names another, or none.
    """
    named = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in named if p not in PAIRS]
    if unknown or not named:
        raise argparse.ArgumentTypeError(f"must name some of {', '.join(PAIRS)}, not {text!r}")
    return named


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.limits``; returns the exit status (1: a drain was not exactly once,
    or the limit did not hold)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.limits",
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--tasks", type=positive, default=20_000, help="tasks of every drain")
    parser.add_argument("--keys", type=positive, default=1_000, help="tenants the fairness pair's tasks spread over")
    parser.add_argument(
        "--baseline", default=BASELINE, help="the commit whose plain drain this checkout's is set against (none: skip)"
    )
    parser.add_argument("--rounds", type=count, default=3, help="rounds of the three pairs")
    parser.add_argument(
        "--pairs",
        type=pairs,
        default=PAIRS,
        help="the pairs each round runs, comma-separated (baseline alone: the no-limit drain against --baseline, "
        "more rounds of it in the same time)",
    )
    add_instance_arguments(parser, DATABASE)
    args = parser.parse_args(argv)
    if args.keys > args.tasks:
        parser.error("--keys must be at most --tasks: every tenant has a task")
    byte_compile()
    bench = LimitsBench(args)
    asyncio.run(bench.run())
    print_report(bench)
    ok = all(d.exactly_once for r in bench.rounds for d in r.drains())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
