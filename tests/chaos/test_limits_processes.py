"""Task limits across real instances: three ``python -m taskmesh`` processes of ten executors each share one
limit, judged by what the handlers did (a ledger of each run's start and end by PostgreSQL's clock).

- a concurrency limit of 3: never more than 3 runs at once, 3 reached, every task completed, no retry spent;
- ``kill -9`` of an instance holding slots: they come back within one lease, and the limit still holds;
- a flush of the deployment's Redis keys mid-run: the limit still holds, every task completed;
- a rate of 20/s (burst 1) for 60 s: 1,200 starts within 5 %, no second holding more than rate + burst
  admissions (timed by Redis's clock, the one the admission reads, on a Redis of the test's own that
  ``redis-cli monitor`` watches: the claims and the handlers' starts come a moment later, by a delay
  that varies on a loaded machine, and their busiest second is printed beside).

The machine's PostgreSQL and Redis: a new database per test, the test's own key prefix. The processes
import taskmesh from the ``src`` beside these tests (``PYTHONPATH``), so that they run the code under
test wherever the venv's editable install points. The figures are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import bisect
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from taskmesh.store.keys import Keys
from taskmesh.store.postgres import migrate_url
from tests.conftest import redis_server, scratch_database
from tests.proc import Proc, call, spawn, stores_env
from tests.tools import require_tool

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "default"
INSTANCES = 3
EXECUTORS = 10
LIMIT = 3
LEASE = 2.0
KILL_MARGIN = 1.0
"""What a killed instance's slots may take past its lease to be used again: the delayed mover looks at the
limit key when its earliest slot lapses (then, or at its next tick 0.1 s later when another instance's mover
held the lock), and the reclaimer every 0.5 s (either gives the slot back); then a pop, the admission, the
claim's commit and the handler's first insert, tens of milliseconds each, on a 2-core machine that runs
other tests beside these."""
RATE = 20
BURST = 1
RATE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Run:
    """One row of the ledger: a run of ``lim.ledger``, its times in epoch seconds by PostgreSQL's clock."""

    task_id: str
    attempt: int
    pid: int
    started: float
    ended: float | None
    """``None``: no end was written (its instance was killed, or it still runs)."""


class Deployment:
    """Instances on one database and key prefix, and what the test reads of them."""

    def __init__(self, url: str, redis_url: str, prefix: str, spawn: Any, redis: aioredis.Redis) -> None:
        self.url = url
        self.redis_url = redis_url
        self.prefix = prefix
        self.spawn = spawn
        self.redis = redis
        self.procs: list[Proc] = []
        self.env: dict[str, str] = {}

    def use(self, redis: WatchedRedis) -> None:
        """Start the instances on ``redis`` (a standalone server) instead of the tests' Redis."""
        self.redis_url, self.redis = redis.url, redis.client
        self.env["TASKMESH_REDIS_MODE"] = "standalone"

    async def start(self, limits: dict[str, Any], count: int = INSTANCES, prefetch: int = 0) -> list[Proc]:
        """Start ``count`` instances holding ``limits`` (``TASKMESH_LIMITS``), each claiming ``prefetch`` ahead
        (then of a full key too: ``limits/standby.py``); return once every one is ready and the queue's keys
        are built (before that the admission starts no limited id)."""
        env = stores_env(
            self.url,
            self.redis_url,
            self.prefix,
            WORKER_CONCURRENCY=str(EXECUTORS),
            TASKMESH_PREFETCH=str(prefetch),
            TASKMESH_LIMITS=json.dumps(limits),
            TASKMESH_LEASE_SECONDS=str(LEASE),
            TASKMESH_RECLAIM_INTERVAL_SECONDS="0.5",
            TASKMESH_RECONCILE_INTERVAL_SECONDS="1",
            TASKMESH_SHUTDOWN_GRACE_SECONDS="5",
            TASKMESH_LOG_LEVEL="warning",
            PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}",
            **self.env,
        )
        procs = [self.spawn(**env) for _ in range(count)]
        self.procs += procs
        marker = Keys(self.prefix).marker(QUEUE)
        deadline = time.monotonic() + 30
        for proc in procs:
            while not _ready(proc):
                assert proc.alive(), f"an instance exited with {proc.popen.returncode}:\n{proc.output()[-3000:]}"
                assert time.monotonic() < deadline, f"an instance was not ready within 30 s:\n{proc.output()[-3000:]}"
                await anyio.sleep(0.1)
        while not await self.redis.exists(marker):
            assert time.monotonic() < deadline, "the queue's keys were not built within 30 s"
            await anyio.sleep(0.05)
        return procs

    def create(self, count: int, seconds: float) -> list[str]:
        """Create ``count`` tasks of ``lim.ledger`` that sleep ``seconds``, through the first instance's API."""
        ids: list[str] = []
        while len(ids) < count:
            body = {"tasks": [{"name": "lim.ledger", "payload": {"seconds": seconds}}] * min(500, count - len(ids))}
            status, answer = call(self.procs[0].port, "POST", "/api/v1/tasks:batch", body)
            assert status in (200, 201), answer
            ids += [r["task_id"] for r in answer["results"]]
        return ids

    async def runs(self) -> list[Run]:
        """The ledger, by start."""
        conn = await asyncpg.connect(self.url)
        try:
            rows = await conn.fetch(
                "SELECT task_id, attempt, pid, extract(epoch FROM started)::float8 AS started,"
                " extract(epoch FROM ended)::float8 AS ended FROM limit_ledger ORDER BY started"
            )
        finally:
            await conn.close()
        return [Run(str(r["task_id"]), r["attempt"], r["pid"], r["started"], r["ended"]) for r in rows]

    async def claims(self) -> list[float]:
        """When each run was claimed (``task_runs.claimed_at``, PostgreSQL's clock), epoch seconds."""
        conn = await asyncpg.connect(self.url)
        try:
            rows = await conn.fetch("SELECT extract(epoch FROM claimed_at)::float8 AS at FROM task_runs")
        finally:
            await conn.close()
        return [r["at"] for r in rows]

    async def now(self) -> float:
        """PostgreSQL's clock, epoch seconds."""
        conn = await asyncpg.connect(self.url)
        try:
            return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8"))
        finally:
            await conn.close()

    async def statuses(self) -> dict[str, int]:
        conn = await asyncpg.connect(self.url)
        try:
            return {r["status"]: r["n"] for r in await conn.fetch("SELECT status, count(*) AS n FROM tasks GROUP BY 1")}
        finally:
            await conn.close()

    async def all_completed(self, count: int, timeout: float) -> None:
        """Wait until ``count`` tasks are completed; fail after ``timeout`` s with the statuses and logs."""
        deadline = time.monotonic() + timeout
        while (statuses := await self.statuses()).get("completed", 0) < count:
            if time.monotonic() > deadline:
                logs = "\n".join(p.output()[-1500:] for p in self.procs)
                raise AssertionError(f"not every task completed within {timeout} s: {statuses}\n{logs}")
            await anyio.sleep(0.2)

    async def retries_spent(self) -> tuple[int, int]:
        """``(most attempts, most retries)`` over the tasks."""
        conn = await asyncpg.connect(self.url)
        try:
            row = await conn.fetchrow("SELECT max(attempts) AS a, max(retries) AS r FROM tasks")
        finally:
            await conn.close()
        assert row is not None  # an aggregate answers one row
        return int(row["a"]), int(row["r"])

    async def open_runs(self, at_least: int, timeout: float = 20.0) -> list[Run]:
        """Wait until at least ``at_least`` runs have started and not ended; returns them."""
        deadline = time.monotonic() + timeout
        while len(running := [r for r in await self.runs() if r.ended is None]) < at_least:
            assert time.monotonic() < deadline, f"fewer than {at_least} runs at once within {timeout} s"
            await anyio.sleep(0.05)
        return running


def _ready(proc: Proc) -> bool:
    try:
        return call(proc.port, "GET", "/readyz")[0] == 200
    except OSError:
        return False


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans ``[start, end)`` holding one instant."""
    # at one instant an end comes before a start: a slot given back and taken again is not two at once
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def first_reaching(spans: list[tuple[float, float]], n: int, after: float) -> float | None:
    """The first instant after ``after`` at which ``n`` spans ``[start, end)`` hold at once, or ``None``."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = 0
    for t, step in events:
        now += step
        if t > after and now >= n:
            return t
    return None


def busiest(times: list[float], seconds: float = 1.0) -> int:
    """The most of ``times`` in one window ``[t, t + seconds)``."""
    ordered = sorted(times)
    return max((bisect.bisect_left(ordered, t + seconds) - i for i, t in enumerate(ordered)), default=0)


def spans_of(runs: list[Run], open_until: float) -> list[tuple[float, float]]:
    """Each run's ``(start, end)``; a run with no end counts as running until ``open_until``."""
    return [(r.started, r.ended if r.ended is not None else open_until) for r in runs]


class WatchedRedis:
    """A Redis of the test's own whose every command ``redis-cli monitor`` writes down, stamped by Redis's clock.

    :param url: its URL.
    :param client: a client of it.
    :param log: where the monitor writes.
    """

    def __init__(self, url: str, client: aioredis.Redis, log: Path) -> None:
        self.url = url
        self.client = client
        self.log = log

    def admissions(self, gcra_key: str) -> list[float]:
        """When the admission let a task of a rated limit key start, epoch seconds by Redis's clock: each
        start sets the key's GCRA time (``lua/limits_lib.lua``, ``take``)."""
        needle = f'"SET" "{gcra_key}"'
        lines = self.log.read_text(errors="replace").splitlines()
        return [float(line.split(" ", 1)[0]) for line in lines if needle in line]


@pytest.fixture
async def watched_redis(tmp_path: Path) -> AsyncIterator[WatchedRedis]:
    """A Redis of the test's own (``redis_server``) watched by ``redis-cli monitor``: MONITOR on the shared
    Redis would stream every other test's commands too, and slow them."""
    cli = require_tool("redis-cli", "Debian package redis-tools", "the admissions of a rate were not timed")
    log = tmp_path / "monitor.log"
    with redis_server() as port, log.open("wb") as out:
        monitor = subprocess.Popen([cli, "-p", str(port), "monitor"], stdout=out)
        client = aioredis.Redis(port=port)
        try:
            yield WatchedRedis(f"redis://127.0.0.1:{port}/0", client, log)
        finally:
            await client.aclose()
            monitor.terminate()
            monitor.wait(10)


@pytest.fixture
async def deployment(
    store_urls: tuple[str, str], redis_url: str, prefix: str, redis_client: aioredis.Redis, spawn: Any
) -> AsyncIterator[Deployment]:
    """A new database with the ledger table, and instances on it (``spawn``: killed before the database is
    dropped and the prefix's keys are deleted, which happen in the reverse order of these arguments)."""
    async with scratch_database(store_urls[0], "tm_limits") as url:
        await migrate_url(url)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "CREATE TABLE limit_ledger (task_id uuid NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
                " started timestamptz NOT NULL, ended timestamptz, PRIMARY KEY (task_id, attempt))"
            )
        finally:
            await conn.close()
        dep = Deployment(url, redis_url, prefix, spawn, redis_client)
        try:
            yield dep
        finally:
            for proc in dep.procs:
                if proc.alive():
                    proc.kill()


@pytest.mark.parametrize("prefetch", [0, 3], ids=["parked", "claimed-ahead"])
async def test_a_concurrency_limit_of_three_holds_across_three_instances_of_ten_executors(
    deployment: Deployment, prefetch: int
) -> None:
    await deployment.start({"api": {"task": "lim.ledger", "concurrency": LIMIT}}, prefetch=prefetch)
    ids = deployment.create(30, seconds=0.3)
    await deployment.all_completed(len(ids), timeout=40)

    runs = await deployment.runs()
    most = most_at_once(spans_of(runs, open_until=float("inf")))
    by_instance = Counter(r.pid for r in runs)
    print(
        f"\nlimits: concurrency {LIMIT} over {INSTANCES}x{EXECUTORS} executors: most at once {most}, "
        f"runs {len(runs)}, runs per instance {sorted(by_instance.values())}"
    )
    assert most == LIMIT
    assert len(runs) == len(ids)
    assert all(r.ended is not None for r in runs)
    assert await deployment.retries_spent() == (1, 0)  # a parked id spent no attempt, no retry


@pytest.mark.parametrize("prefetch", [0, 3], ids=["parked", "claimed-ahead"])
async def test_a_killed_instance_gives_its_slots_back_within_one_lease_and_the_limit_holds(
    deployment: Deployment, prefetch: int
) -> None:
    procs = await deployment.start({"api": {"task": "lim.ledger", "concurrency": LIMIT}}, prefetch=prefetch)
    # Runs of 5 s: no other run ends until well after a lease past the kill, so the next start after it
    # takes a slot the killed instance held.
    ids = deployment.create(6, seconds=5.0)
    running = await deployment.open_runs(LIMIT)
    held = Counter(r.pid for r in running)
    victim_pid, holds = held.most_common(1)[0]
    [victim] = [p for p in procs if p.pid == victim_pid]
    killed_from = await deployment.now()
    victim.kill()
    killed_by = await deployment.now()
    # the next start, waited for a little longer than it may take (a failure then says so sooner)
    deadline = time.monotonic() + LEASE + KILL_MARGIN + 5
    while not [r for r in await deployment.runs() if r.started > killed_from and r.pid != victim_pid]:
        statuses = await deployment.statuses()
        assert time.monotonic() < deadline, (
            f"no run started within {LEASE + KILL_MARGIN + 5:g} s of the kill: {statuses}"
        )
        await anyio.sleep(0.1)
    await deployment.all_completed(len(ids), timeout=45)

    runs = await deployment.runs()
    lost = [r for r in runs if r.pid == victim_pid and r.ended is None]
    survivors = [r for r in runs if r.pid != victim_pid]
    later = [r.started for r in survivors if r.started > killed_from]
    gap = min(later) - killed_from
    back = first_reaching(spans_of(survivors, open_until=float("inf")), LIMIT, after=killed_from)
    assert back is not None
    most = most_at_once(spans_of(runs, open_until=killed_by))
    print(
        f"\nlimits: kill -9 of an instance holding {holds} of {LIMIT} slots (lease {LEASE:g} s): "
        f"next start {gap:.2f} s after the kill, {LIMIT} at once again after {back - killed_from:.2f} s, "
        f"most at once {most}, runs {len(runs)} ({len(lost)} cut short)"
    )
    assert len(lost) == holds
    # claimed ahead, the killed instance may have held every other task too: those come back as its
    # lost runs do, when its lease ends and the reclaimer next looks (every 0.5 s) and requeues them
    bound = LEASE + KILL_MARGIN + (1.0 if prefetch else 0.0)
    assert gap <= bound
    assert back - killed_from <= bound
    assert most <= LIMIT


async def test_a_flush_of_the_deployments_redis_keys_mid_run_keeps_the_limit_across_instances(
    deployment: Deployment, redis_client: aioredis.Redis
) -> None:
    await deployment.start({"api": {"task": "lim.ledger", "concurrency": LIMIT}})
    # Runs of 2 s outlast the reconciler's rebuild (it looks every second): their slots must come back
    # from PostgreSQL, or the tasks created after the flush would start beside them.
    ids = deployment.create(6, seconds=2.0)
    await deployment.open_runs(LIMIT)
    # The prefix's keys only: other tests share this Redis.
    flushed = [key async for key in redis_client.scan_iter(match=f"{deployment.prefix}:*", count=1000)]
    await redis_client.delete(*flushed)
    ids += deployment.create(9, seconds=0.3)  # pushed before the reconciler has rebuilt the slots
    await deployment.all_completed(len(ids), timeout=45)

    runs = await deployment.runs()
    most = most_at_once(spans_of(runs, open_until=float("inf")))
    print(
        f"\nlimits: Redis flush of {len(flushed)} keys mid-run: most at once {most}, runs {len(runs)}, "
        f"instances that ran tasks {len({r.pid for r in runs})}"
    )
    assert most == LIMIT
    assert {r.task_id for r in runs} == set(ids)


async def test_a_rate_of_twenty_a_second_holds_for_a_minute_across_three_instances(
    watched_redis: WatchedRedis, deployment: Deployment
) -> None:
    deployment.use(watched_redis)
    await deployment.start({"rl": {"task": "lim.ledger", "rate": f"{RATE}/s", "burst": BURST}})
    deployment.create(round(RATE * RATE_SECONDS * 1.1), seconds=0.0)  # more than a minute's worth
    deadline = time.monotonic() + 20
    while not (runs := await deployment.runs()):
        assert time.monotonic() < deadline, "no run started within 20 s"
        await anyio.sleep(0.1)
    first = runs[0].started
    await anyio.sleep(first + RATE_SECONDS + 0.5 - await deployment.now())  # one wait: no reads to slow them

    starts = [r.started for r in await deployment.runs()]
    within = [t for t in starts if first <= t < first + RATE_SECONDS]
    admitted = watched_redis.admissions(f"{deployment.prefix}:{{{QUEUE}}}:lim:gcra:rl")
    claims = await deployment.claims()
    expected = RATE * RATE_SECONDS
    print(
        f"\nlimits: rate {RATE}/s burst {BURST} for {RATE_SECONDS:g} s on {INSTANCES} instances: {len(within)} "
        f"handler starts (expected {expected:g}); busiest 1-s window: {busiest(admitted)} admissions, "
        f"{busiest(claims)} claims, {busiest(starts)} handler starts"
    )
    assert abs(len(within) - expected) <= 0.05 * expected
    # The limit holds the admission (Redis's clock). The claim's commit and the handler's first statement
    # come after the instance's pool, executor and round trips, which on a loaded 2-core machine now and
    # then hold a few starts back by 100 ms or more and let them go together: their busiest second may
    # show one or two more (printed above), none of them admitted early.
    assert len(admitted) >= len(within)
    assert busiest(admitted) <= RATE + BURST
