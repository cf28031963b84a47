"""The benchmarks run from the repository root with one command, their figures checked on small runs.

Each run uses a database, key prefix and recorder hashes of its own (``--database``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis.asyncio as aioredis

from tests.cli_support import env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.anyio


def _run(
    module: str, *args: str, stores: tuple[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<module> ARGS`` from the repository root, on ``stores`` (admin URL, Redis URL)."""
    environ = env(DATABASE_URL=stores[0], REDIS_URL=stores[1]) if stores else env()
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        env=environ,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("handler", ["recorder", "empty"])
async def test_a_small_drain_prints_every_figure_and_every_task_ran_once(
    store_urls: tuple[str, str], handler: str
) -> None:
    admin, redis_url = store_urls
    database = f"tmbench_{uuid.uuid4().hex[:10]}"
    extra = ["--empty-handler"] if handler == "empty" else []
    try:
        args = ("--skip-http", "--spin-tasks", "0", "--tasks", "400", "--database", database, *extra)
        done = _run("bench", *args, stores=store_urls)
    finally:
        await _clean_up(admin, redis_url, database)
    assert done.returncode == 0, done.stderr
    kind = "tasks of a handler that does nothing (--empty-handler: taskmesh's own cost)" if extra else "no-op tasks"
    assert f"taskmesh bench: 400 {kind}, one instance" in done.stdout
    assert "exactly once            yes (ran=400 duplicated=0 completed=400 runs=400)" in done.stdout
    cpu = re.search(r"CPU per task +instance (\d+) us, postgres \(its backends\) (\d+) us, redis (\d+) us", done.stdout)
    assert cpu is not None, done.stdout
    assert int(cpu[1]) > 0 and int(cpu[2]) > 0
    start = re.search(r"the first task started (\d+\.\d+) s after launch", done.stdout)
    assert start is not None and 0 < float(start[1]) < 30


async def test_the_growth_benchmark_measures_a_small_history(store_urls: tuple[str, str]) -> None:
    admin, redis_url = store_urls
    database = f"tmgrowth_{uuid.uuid4().hex[:10]}"
    try:
        done = _run("growth", "--rows", "20000", "--database", database, stores=store_urls)
    finally:
        await _clean_up(admin, redis_url, database)
    assert done.returncode == 0, done.stderr
    assert "taskmesh growth: 20,000 finished tasks of history" in done.stdout
    for line in ("POST /api/v1/tasks      at 200/s: p50 ", "retention batch ", "DLQ mirror ", "instance RSS "):
        assert line in done.stdout, done.stdout


@pytest.mark.timeout(300)
async def test_the_workflows_benchmark_compares_each_workflow_and_the_baseline_with_plain_tasks(
    store_urls: tuple[str, str],
) -> None:
    admin, redis_url = store_urls
    database = f"tmwfbench_{uuid.uuid4().hex[:10]}"
    sizes = ("--fanout", "60", "--chains", "20", "--baseline-tasks", "200", "--rounds", "1")
    rest = ("--rest-chains", "10", "--rest-rate", "50", "--timeout", "60")
    try:
        done = _run("workflows", *sizes, *rest, "--database", database, stores=store_urls)
    finally:
        await _clean_up(admin, redis_url, database, f"{database}_tpl", f"{database}_btpl")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for label, tasks in (
        ("plain 62", 62),
        ("fan-out 1 -> 60 -> 1", 62),
        ("plain 60", 60),
        ("chains 20 x a -> b -> c", 60),
        ("plain 200 on 1c898d0", 200),
        ("plain 200 on this checkout", 200),
    ):
        line = re.search(rf"^  {re.escape(label)} +{tasks} tasks: store .* drain +[\d,]+ tasks/s .*$", out, re.M)
        assert line is not None, out
        assert f"exactly once yes (tasks={tasks} completed={tasks} runs={tasks} duplicated=0" in line[0], line[0]
    assert "workflows completed=1/1)" in out and "workflows completed=20/20)" in out
    rows = {row.split(" | ")[0].removeprefix("| "): row for row in out.splitlines() if row.startswith("| ")}
    for figure in (
        "fan-out 1 → 60 → 1, drain, tasks/s",
        "fan-out 1 → 60 → 1, end to end, tasks/s",
        "20 chains a → b → c, drain, tasks/s",
        "20 chains a → b → c, end to end, tasks/s",
        "plain drain (200 tasks), this checkout against 1c898d0, tasks/s",
    ):
        assert re.search(r"\| \d+\.\d\dx \|", rows[figure]), rows[figure]
    at_rest = rows["join delay at rest, p50 / p99, ms (20 steps b and c of 10 chains at 50/s)"]
    p50, p99 = (float(v) for v in re.findall(r"\| (\d+\.\d) / (\d+\.\d) \|", at_rest)[0])
    assert 0 < p50 <= p99 < 5000, at_rest
    assert "(the roots' pickup)" in at_rest, at_rest
    fan_in = rows["fan-in join delay after the map's last task, ms"]
    assert 0 < float(fan_in.split(" | ")[1]) < 5000, fan_in


@pytest.mark.timeout(240)
async def test_the_limits_benchmark_compares_each_flow_control_with_the_same_drain_without_it(
    store_urls: tuple[str, str],
) -> None:
    admin, redis_url = store_urls
    database = f"tmlimbench_{uuid.uuid4().hex[:10]}"
    sizes = (
        "--tasks",
        "200",
        "--keys",
        "50",
        "--rounds",
        "1",
        "--concurrency",
        "4",
        "--prefetch",
        "1",
        "--timeout",
        "60",
    )
    try:
        done = _run("limits", *sizes, "--database", database, stores=store_urls)
    finally:
        await _clean_up(admin, redis_url, database, f"{database}_tpl", f"{database}_btpl")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for label in (
        "no limit",
        "limit = executors (4)",
        "50 tenants, no fairness",
        "50 tenants, fairness",
        "no limit, db4514b",
        "no limit, this checkout",
    ):
        line = re.search(rf"^  {re.escape(label)} +200 tasks: store .* drain +[\d,]+ tasks/s .*$", out, re.M)
        assert line is not None, out
        assert "exactly once yes (tasks=200 completed=200 runs=200 duplicated=0)" in line[0], line[0]
    limited = re.search(r"^  limit = executors \(4\) .*; at most (\d+) runs open at once$", out, re.M)
    assert limited is not None and int(limited[1]) >= 1, out
    served = re.search(r"^  50 tenants, fairness .*; the first 50 runs served (\d+) tenants$", out, re.M)
    assert served is not None and int(served[1]) >= 40, out  # fair shares: one task of each tenant in turn
    rows = {row.split(" | ")[0].removeprefix("| "): row for row in out.splitlines() if row.startswith("| ")}
    for figure in (
        "limit = executors (4), 200 tasks, drain, tasks/s",
        "limit = executors (4), 200 tasks, end to end, tasks/s",
        "fairness over 50 keys, 200 tasks, drain, tasks/s",
        "fairness over 50 keys, 200 tasks, end to end, tasks/s",
        "no limit, 200 tasks, this checkout against db4514b, drain, tasks/s",
    ):
        assert re.search(r"\| \d+\.\d\dx \| \d+\.\d\dx \|", rows[figure]), rows[figure]  # the round's, the median
    assert "most runs claimed and not yet written at once (task_runs)" in rows


async def _clean_up(admin: str, redis_url: str, database: str, *more: str) -> None:
    """Drop the run's database and ``more`` databases, its keys and its recorder's hashes (db 15 of the same Redis)."""
    conn = await asyncpg.connect(admin)
    try:
        for name in (database, *more):
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await conn.close()
    parts = urlsplit(redis_url)
    for url, pattern in ((redis_url, f"{database}:*"), (urlunsplit((*parts[:2], "/15", "", "")), f"{database}:*")):
        client = aioredis.Redis.from_url(url)
        try:
            async for key in client.scan_iter(match=pattern, count=1000):
                await client.delete(key)
        finally:
            await client.aclose()


def _refused(*args: str) -> str:
    """The benchmark's error line for ``args``, which it must refuse with status 2 before doing anything."""
    done = _run("bench", *args)
    assert done.returncode == 2, done.stderr
    return done.stderr.splitlines()[-1]


def test_the_empty_handler_cannot_be_compared_and_a_database_name_must_be_plain() -> None:
    assert _refused("--empty-handler", "--compare") == (
        "python -m benchmarks.bench: error: --empty-handler cannot be used with --compare: "
        "it measures taskmesh alone, the peers run their job body"
    )
    assert _refused("--database", "x; DROP TABLE y") == (
        "python -m benchmarks.bench: error: argument --database: "
        "'x; DROP TABLE y' is not a plain lower-case identifier ([a-z_][a-z0-9_]*)"
    )
