"""Chaos suite: three real instances, kill -9, a Redis flush and restart, a PostgreSQL restart.

The test owns its stores (an embedded PostgreSQL and an embedded Valkey it
may restart), enqueues ``CHAOS_TASKS`` tasks (default 1,000) whose handlers
sleep 0-200 ms and record ``(task, attempt, pid, start, end)`` in a ledger
(a table; a file for the ``def`` handler, which runs in worker processes
killed with their instance), a third of them blocking the event loop for up
to 50 ms on the way, and runs three ``python -m taskmesh`` processes while it kills a random
one with SIGKILL every few seconds (starting a replacement), flushes Redis
once, restarts Redis once and restarts PostgreSQL once. Then it stops every
instance with SIGTERM and checks:

- none lost: every task is ``completed``;
- no attempt ran twice at once: no two ledger entries of one task overlap;
- every task with more than one ledger entry is explained by a kill (an
  earlier entry's process was killed) or a restart (it ended around one).

Beside the plain tasks run ``CHAOS_WORKFLOWS`` workflows (default 20): half a fan-out/fan-in (a root,
a map of 10, a join), half a diamond, their nodes recording their runs in ``wf_ledger``. At the end:
every workflow completed (none stuck), each join's task made once and first claimed after every
dep's last run ended (by PostgreSQL's clock: never early), handed every dep's result; their runs
join the overlap and explanation checks.

``CHAOS_TASKS``, ``CHAOS_WORKFLOWS`` and ``CHAOS_SECONDS`` (the run's time limit, default 170)
make it bigger. Figures are printed at the end.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import redis as sync_redis

import taskmesh
from taskmesh.dev.stack import EmbeddedPostgres, EmbeddedValkey
from tests.chaos.conftest import fresh_database
from tests.proc import Proc, call, spawn, wait_until

__all__ = ["spawn"]  # a fixture, used by name
TASKS = int(os.environ.get("CHAOS_TASKS", "1000"))
WORKFLOWS = int(os.environ.get("CHAOS_WORKFLOWS", "20"))
FAN = 10
"""Tasks of each fan-out's map node."""
SECONDS = float(os.environ.get("CHAOS_SECONDS", "170"))
INSTANCES = 3
KILL_EVERY = 3.0
LEASE = 2.0
HANDLERS: list[tuple[str, dict[str, float]]] = [
    ("ledger", {"max_sleep": 0.2}),
    ("ledger_sync", {"max_sleep": 0.2}),
    ("ledger_blocking", {"max_sleep": 0.2, "max_block": 0.05}),
]
"""Tasks take turns: an async handler, a def handler (worker processes), one that blocks the event loop."""
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(int(SECONDS) + 300)]


async def _count_completed(url: str) -> int | None:
    try:
        conn = await asyncpg.connect(url, timeout=2)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return None
    try:
        return int(await conn.fetchval("SELECT count(*) FROM tasks WHERE status = 'completed'"))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return None
    finally:
        await conn.close()


def workflow_body(i: int) -> tuple[dict[str, Any], int, dict[str, int]]:
    """The ``i``-th workflow: its body, how many tasks it makes, and each join with how many results it is handed."""
    step = {"seconds": 0.05}
    nodes: list[dict[str, Any]]
    if i % 2 == 0:
        nodes = [
            {"id": "root", "task": "wf_ledger", "payload": step},
            {"id": "fan", "task": "wf_ledger", "deps": ["root"], "map": [step] * FAN, "max_retries": 20},
            {"id": "join", "task": "wf_ledger", "payload": step, "deps": ["fan"], "max_retries": 20},
        ]
        return {"name": "chaos-fan", "dedup_key": f"chaos-wf-{i}", "nodes": nodes}, FAN + 2, {"join": FAN}
    nodes = [
        {"id": "top", "task": "wf_ledger", "payload": step},
        {"id": "left", "task": "wf_ledger", "payload": step, "deps": ["top"]},
        {"id": "right", "task": "wf_ledger", "payload": step, "deps": ["top"]},
        {"id": "bottom", "task": "wf_ledger", "payload": step, "deps": ["left", "right"]},
    ]
    for node in nodes:
        node["max_retries"] = 20
    joins = {"left": 1, "right": 1, "bottom": 2}
    return {"name": "chaos-diamond", "dedup_key": f"chaos-wf-{i}", "nodes": nodes}, 4, joins


async def check_workflows(conn: asyncpg.Connection, joins: dict[str, dict[str, int]]) -> dict[str, int]:
    """Each workflow completed; each join made once, first claimed after its deps' last run ended, handed all.

    :param joins: per workflow id, each join node with how many results it is handed.
    :returns: counts of what was wrong (all 0 on a good run).
    """
    wrong = {"stuck": 0, "joins_twice": 0, "joins_early": 0, "joins_short": 0}
    for workflow_id, nodes in joins.items():
        wid = uuid.UUID(workflow_id)
        if await conn.fetchval("SELECT status FROM workflows WHERE id = $1", wid) != "completed":
            wrong["stuck"] += 1
        for node, handed in nodes.items():
            tasks = await conn.fetch("SELECT id FROM tasks WHERE workflow_id = $1 AND workflow_node = $2", wid, node)
            wrong["joins_twice"] += len(tasks) != 1
            early = await conn.fetchval(
                "SELECT (SELECT min(r.claimed_at) FROM task_runs r JOIN tasks t ON t.id = r.task_id"
                "        WHERE t.workflow_id = $1 AND t.workflow_node = $2)"
                "     < (SELECT max(r.finished_at) FROM task_runs r JOIN tasks t ON t.id = r.task_id"
                "        JOIN workflow_edges e ON e.workflow_id = t.workflow_id AND e.parent = t.workflow_node"
                "        WHERE t.workflow_id = $1 AND e.child = $2)",
                wid,
                node,
            )
            wrong["joins_early"] += bool(early)
            got = await conn.fetch(
                "SELECT l.handed FROM wf_ledger l JOIN tasks t ON t.id = l.task_id"
                " WHERE t.workflow_id = $1 AND t.workflow_node = $2",
                wid,
                node,
            )
            wrong["joins_short"] += any(r["handed"] != handed for r in got)
    return wrong


async def test_no_task_is_lost_and_no_attempt_runs_twice_at_once_under_chaos(
    owned_stores: tuple[EmbeddedPostgres, EmbeddedValkey], spawn: Any, tmp_path: Path
) -> None:
    pg, valkey = owned_stores
    url = await fresh_database(pg, "chaos")
    sync_ledger = tmp_path / "sync-ledger"
    sync_ledger.mkdir()
    conn = await asyncpg.connect(url)
    await conn.execute(
        "CREATE TABLE ledger (task_id uuid NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
        " started float8 NOT NULL, ended float8 NOT NULL)"
    )
    await conn.execute(
        "CREATE TABLE wf_ledger (node text NOT NULL, task_id uuid NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
        " started float8 NOT NULL, ended float8 NOT NULL, handed int NOT NULL)"
    )
    await conn.close()
    env = {
        "DATABASE_URL": url,
        "REDIS_URL": valkey.url,
        "TASKMESH_HANDLERS": "tests.process_handlers",
        "TASKMESH_LEASE_SECONDS": str(LEASE),
        "TASKMESH_RECLAIM_INTERVAL_SECONDS": "0.5",
        "TASKMESH_RECONCILE_INTERVAL_SECONDS": "1",
        "TASKMESH_SHUTDOWN_GRACE_SECONDS": "5",
        "WORKER_CONCURRENCY": "4",
        "TASKMESH_LOG_LEVEL": "warning",
    }

    def start() -> Proc:
        proc: Proc = spawn(**env)
        return proc

    live = [start() for _ in range(INSTANCES)]
    for proc in live:
        wait_until(lambda p=proc: call(p.port, "GET", "/readyz")[0] == 200, timeout=60, proc=proc)

    t0 = time.monotonic()
    async with taskmesh.Client(url, valkey.url, pool_size=8) as client:

        async def enqueue(start_at: int) -> None:
            for i in range(start_at, min(start_at + 100, TASKS)):
                # An async handler, a def handler (in worker processes), and one that blocks the loop.
                name, payload = HANDLERS[i % len(HANDLERS)]
                await client.enqueue(
                    name, {**payload, "dir": str(sync_ledger)}, max_retries=20, idempotency_key=f"chaos-{i}"
                )

        async with anyio.create_task_group() as tg:
            for start_at in range(0, TASKS, 100):
                tg.start_soon(enqueue, start_at)
    joins: dict[str, dict[str, int]] = {}
    expected = TASKS
    for i in range(WORKFLOWS):
        body, made, nodes = workflow_body(i)
        status, answer = call(live[i % len(live)].port, "POST", "/api/v1/workflows", body)
        assert status == 201, answer
        joins[answer["workflow_id"]] = nodes
        expected += made
    enqueued_in = time.monotonic() - t0

    killed: dict[int, float] = {}
    windows: list[tuple[str, float, float]] = []  # (what, wall-clock start, end) of each store disruption
    done_flush = done_redis = done_pg = False
    next_kill = time.monotonic() + KILL_EVERY
    completed = 0
    deadline = t0 + SECONDS
    rng = random.Random(7)
    redis_admin = sync_redis.Redis.from_url(valkey.url)
    while time.monotonic() < deadline:
        got = await _count_completed(url)
        completed = got if got is not None else completed
        if completed >= expected:
            break
        progress = completed / expected
        if time.monotonic() >= next_kill:
            victim = rng.choice(live)
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            killed[victim.pid] = time.time()
            live.remove(victim)
            live.append(start())
            next_kill = time.monotonic() + KILL_EVERY
        if not done_flush and progress >= 0.15:
            w0 = time.time()
            redis_admin.flushall()
            windows.append(("redis flush", w0, time.time()))
            done_flush = True
        elif not done_redis and progress >= 0.40:
            w0 = time.time()
            valkey.restart()
            windows.append(("redis restart", w0, time.time()))
            done_redis = True
        elif not done_pg and progress >= 0.65:
            w0 = time.time()
            pg.restart()
            windows.append(("postgres restart", w0, time.time()))
            done_pg = True
        await anyio.sleep(0.25)
    run_seconds = time.monotonic() - t0
    redis_admin.close()

    exits = []
    for proc in live:  # a replacement still starting would not be a fair test of SIGTERM
        wait_until(lambda p=proc: call(p.port, "GET", "/readyz")[0] == 200, timeout=60, proc=proc)
    for proc in live:
        proc.signal(signal.SIGTERM)
    for proc in live:
        exits.append(proc.wait(30))

    conn = await asyncpg.connect(url)
    try:
        statuses: dict[str, int] = {
            status: count for status, count in await conn.fetch("SELECT status, count(*) FROM tasks GROUP BY status")
        }
        rows: list[asyncpg.Record | dict[str, Any]] = list(
            await conn.fetch(
                "SELECT task_id, attempt, pid, started, ended FROM ledger"
                " UNION ALL SELECT task_id, attempt, pid, started, ended FROM wf_ledger"
            )
        )
        workflows_wrong = await check_workflows(conn, joins)
        # What happened to a task that did not complete, run by run, for the failure message.
        unfinished = [
            dict(r)
            for r in await conn.fetch(
                "SELECT t.id, t.status, r.attempt, r.status AS run_status, r.worker_id, r.error, r.finished_at"
                " FROM tasks t JOIN task_runs r ON r.task_id = t.id WHERE t.status <> 'completed'"
                " ORDER BY t.id, r.attempt LIMIT 50"
            )
        ]
    finally:
        await conn.close()

    for path in sync_ledger.glob("ledger-*.jsonl"):  # the def handler's runs, one line each
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            rows.append({**entry, "task_id": uuid.UUID(entry["task_id"])})
    rows.sort(key=lambda r: (str(r["task_id"]), r["started"]))
    entries: dict[Any, list[Any]] = defaultdict(list)
    for row in rows:
        entries[row["task_id"]].append(row)
    overlaps = 0
    unexplained = []
    repeated = 0
    margin = LEASE + 5.0
    for task_id, runs in entries.items():
        latest_end = runs[0]["ended"]  # entries are sorted by start
        for later in runs[1:]:
            if later["started"] < latest_end:
                overlaps += 1
            latest_end = max(latest_end, later["ended"])
        if len(runs) > 1:
            repeated += 1
            for earlier in runs[:-1]:
                by_kill = earlier["pid"] in killed
                by_restart = any(w0 - margin <= earlier["ended"] <= w1 + margin for _, w0, w1 in windows)
                if not (by_kill or by_restart):
                    unexplained.append((str(task_id), earlier["attempt"], earlier["pid"]))
    lost = expected - statuses.get("completed", 0)
    print(
        f"\nchaos: tasks={expected} (workflows={WORKFLOWS}) completed={statuses.get('completed', 0)} lost={lost} "
        f"statuses={dict(statuses)} kills={len(killed)} "
        f"disruptions={[w[0] for w in windows]} ledger_entries={len(rows)} tasks_run_more_than_once={repeated} "
        f"overlapping_attempts={overlaps} unexplained={len(unexplained)} "
        f"enqueue_s={enqueued_in:.1f} run_s={run_seconds:.1f} instance_exits={exits} workflows_wrong={workflows_wrong}"
    )
    assert (done_flush, done_redis, done_pg) == (True, True, True), "every disruption happened during the run"
    assert lost == 0, f"{statuses}: {unfinished}"
    assert overlaps == 0
    assert unexplained == []
    assert len(entries) == expected  # every task has at least one recorded run
    assert workflows_wrong == {"stuck": 0, "joins_twice": 0, "joins_early": 0, "joins_short": 0}
    assert exits == [0] * len(live)
