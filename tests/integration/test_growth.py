"""Growth: with a large finished history the hot queries still use indexes, and retention trims it."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from taskmesh.services import retention
from taskmesh.store.postgres import queries
from taskmesh.store.search_queries import search_statements
from taskmesh.tasks.tasks import Tasks

pytestmark = pytest.mark.anyio

HISTORY = 200_000
SEQ_SCAN = re.compile(r"Seq Scan on (public\.)?(tasks|task_runs)\b")


async def fill_history(pool: asyncpg.Pool) -> None:
    await pool.execute(
        f"""INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at,
                               created_at, updated_at)
            SELECT gen_random_uuid(), 'old', 'immediate', 'default', 0, '{{}}', 3,
                   (ARRAY['completed', 'completed', 'completed', 'failed', 'cancelled'])[1 + g % 5],
                   now() - interval '30 days', now() - interval '30 days', now() - interval '30 days'
            FROM generate_series(1, {HISTORY}) g"""
    )
    await pool.execute(
        """INSERT INTO task_runs (task_id, attempt, status, finished_at)
           SELECT id, 1, CASE status WHEN 'completed' THEN 'succeeded' ELSE 'failed' END, updated_at FROM tasks"""
    )
    await pool.execute(
        """INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at)
           SELECT gen_random_uuid(), 'live', 'immediate', 'default', 0, '{}', 3,
                  CASE WHEN g % 2 = 0 THEN 'queued' ELSE 'running' END, now()
           FROM generate_series(1, 200) g"""
    )
    await pool.execute(
        """INSERT INTO task_runs (task_id, attempt, status, worker_id, lease_expires_at)
           SELECT id, 1, CASE status WHEN 'queued' THEN 'queued' ELSE 'running' END, 'w-1', now() + interval '30 s'
           FROM tasks WHERE name = 'live'"""
    )
    await pool.execute("ANALYZE tasks")
    await pool.execute("ANALYZE task_search")
    await pool.execute("ANALYZE task_runs")


def hot_queries(ids: list[uuid.UUID]) -> dict[str, tuple[Any, ...]]:
    now = datetime.now(UTC)
    one = ids[:1]
    return {
        "task_insert_many": (
            [uuid.uuid4()],
            ["n"],
            ["immediate"],
            ["default"],
            [0],
            ["{}"],
            ["k2"],
            [3],
            [now],
            [None],
            [None],
            [None],
            ["queued"],
            [None],
            [None],
            [None],
            [None],
            [None],
        ),
        "task_get_with_latest_run": (ids[0],),
        "task_exists": (ids[0],),
        "run_list_by_task": (ids[0],),
        "task_claim_many": (ids, "default", "w-1", 30.0),
        "task_list_running_limited": ("default",),
        "task_list_unclaimed_queued": (ids,),
        "run_finish_many": (one, one, ["succeeded"], [None], ['"ok"'], [0.0], [None], "w-1"),
        "run_reclaim_expired": (30.0, 500),
        "worker_heartbeat": ("w-1", "h", 1, "{}", "v", "running", 30.0, one, ["a.job"], "{}"),
        "task_list_failed_with_latest_run": ("default", 1000, None),
        "task_lock_oldest_failed": ("default", 10, None),
        "task_count_open_of_tenants": (["t"], [10_000]),
        "task_owner": (ids[0],),
        "task_list_queued_after": ("default", now, ids[0], 5.0, 1000),
        "task_list_failed_ids": ("default", 1000),
        "task_count_queued": (["default"],),
        "task_delete_completed": (7 * 86400.0, 1000),
        "task_delete_cancelled": (7 * 86400.0, 1000),
        "task_delete_failed": (90 * 86400.0, 1000),
        "task_sample_running_by_queue": (["default"],),
        "task_sample_failed_by_queue": (["default"],),
        "task_sample_oldest_ready_age": ("default",),
        "task_count_queued_unserved": (["default"], 10_000),
        "task_lock_status": (ids[0],),
        "task_requeue": (ids, ["failed", "cancelled"], None, None, None, None),
        "task_delete_one_finished": (ids[0],),
        "queue_get_pause": ("default",),
        "queue_list_known": (),
        "queue_depths": (["default"],),
        "bulk_cancel": (ids,),
        "bulk_delete": (ids,),
        "operation_take": ("w-1", 30.0),
    }


def search_queries() -> dict[str, tuple[Any, ...]]:
    """A page of the task search per window key and order, and the window's end (search.sql)."""
    values = {
        "all": None,
        "queue": "default",
        "name": "live",
        "tenant_id": "t",
        "dedup_key": "k",
        "payload": '{"a": 1}',
    }
    start = {
        "desc": (datetime.max, "ffffffff-ffff-ffff-ffff-ffffffffffff"),
        "asc": (datetime.min, str(uuid.UUID(int=0))),
    }
    out: dict[str, tuple[Any, ...]] = {}
    for key, value in values.items():
        for order, (at, tid) in start.items():
            head = (value, datetime.min, datetime.max, at, tid, 10_000)
            out[f"search_page:{key}:{order}"] = (*head, ["failed"], None, None, None, "fire", None, None, None, 50)
            out[f"search_window_end:{key}:{order}"] = head
    return out


def literal(value: Any) -> str:
    """``value`` as an SQL literal (EXECUTE takes no bind parameters); PostgreSQL casts it to the parameter's type."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        items = ["NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in value]
        return literal("{" + ",".join(items) + "}")
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return "'" + text.replace("'", "''") + "'"


async def generic_plan(conn: Any, name: str, sql: str, params: tuple[Any, ...]) -> str:
    """The plan PostgreSQL runs once it caches a generic plan (asyncpg prepares every statement).

    ``EXPLAIN`` with bound values shows a custom plan, planned for those values;
    only ``EXPLAIN EXECUTE`` of a prepared statement under ``force_generic_plan``
    shows the plan that a long-lived connection ends up using.
    """
    await conn.execute(f"PREPARE growth_{name} AS {sql}")
    try:
        args = f"({', '.join(literal(p) for p in params)})" if params else ""
        rows = await conn.fetch(f"EXPLAIN (VERBOSE) EXECUTE growth_{name}{args}")
    finally:
        await conn.execute(f"DEALLOCATE growth_{name}")
    return "\n".join(r[0] for r in rows)


async def test_hot_queries_use_indexes_not_scans_over_a_large_history(pool: asyncpg.Pool) -> None:
    await fill_history(pool)
    ids = [r["id"] for r in await pool.fetch("SELECT id FROM tasks WHERE name = 'live' LIMIT 32")]
    queries_ = {**hot_queries(ids), **search_queries()}
    statements = {**queries(), **search_statements()}
    assert set(queries_) <= set(statements), "a hot query the test names is not in queries.sql or search.sql"
    async with pool.acquire() as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        scans = {}
        for name, params in queries_.items():
            plan = await generic_plan(conn, name.replace(":", "_"), statements[name], params)
            assert "$1" in plan or not params, f"{name}: not a generic plan:\n{plan}"
            if SEQ_SCAN.search(plan):
                scans[name] = plan
        await conn.execute("RESET plan_cache_mode")
    assert scans == {}


async def test_retention_deletes_old_finished_tasks_in_batches_and_keeps_live_ones(
    pool: asyncpg.Pool, tasks: Tasks
) -> None:
    await fill_history(pool)
    keep_failed = {"completed": 7 * 86400.0, "cancelled": 7 * 86400.0, "failed": 90 * 86400.0}
    deleted = await retention.run_once(tasks.pg, keep_failed, batch=5000, max_batches=100)
    assert deleted == {"completed": HISTORY * 3 // 5, "cancelled": HISTORY // 5}
    left = {r["status"]: r["n"] for r in await pool.fetch("SELECT status, count(*) AS n FROM tasks GROUP BY status")}
    assert left == {"failed": HISTORY // 5, "queued": 100, "running": 100}
    assert await pool.fetchval("SELECT count(*) FROM task_runs") == HISTORY // 5 + 200


BACKLOG = 20_000
RUNNING = 1_000


async def fill_backlog(pool: asyncpg.Pool, *, history_analyzed: bool = False) -> None:
    """A queue with a backlog of 20,000 queued tasks (never claimed: no run rows) and 1,000 running
    ones, beside a history of 50,000 completed tasks and their runs.

    :param history_analyzed: ``tasks`` has the statistics of the history alone (as when
        autovacuum analyzed it before the backlog came), else none.
    """
    # Autovacuum would analyze at a moment of its own choosing: the plans would depend on when.
    await pool.execute("ALTER TABLE tasks SET (autovacuum_enabled = false)")
    await pool.execute(
        """INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at, attempts)
           SELECT gen_random_uuid(), 'job', 'immediate', 'default', 0, 'null', 3, 'completed', now(), 1
           FROM generate_series(1, 50000)"""
    )
    if history_analyzed:
        await pool.execute("ANALYZE tasks")
    await pool.execute(
        """INSERT INTO task_runs (id, task_id, attempt, status, finished_at)
           SELECT taskmesh_run_id(id, 1), id, 1, 'succeeded', now() FROM tasks"""
    )
    await pool.execute(
        f"""INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at, attempts)
            SELECT gen_random_uuid(), 'job', 'immediate', 'default', 0, 'null', 3,
                   CASE WHEN g <= {RUNNING} THEN 'running' ELSE 'queued' END, now() - interval '1 s',
                   CASE WHEN g <= {RUNNING} THEN 1 ELSE 0 END
            FROM generate_series(1, {BACKLOG + RUNNING}) g"""
    )
    await pool.execute(
        """INSERT INTO task_runs (id, task_id, attempt, status, worker_id, lease_expires_at)
           SELECT taskmesh_run_id(id, 1), id, 1, 'running', 'w-1', now() + interval '30 s'
           FROM tasks WHERE status = 'running'"""
    )
    # No ANALYZE of the backlog: an instance starts on a bulk enqueue before autovacuum sees it.
    await pool.execute("ANALYZE task_runs")
    await pool.execute("ALTER TABLE tasks RESET (autovacuum_enabled)")


def rows_read(plan: dict[str, Any]) -> int:
    """Rows a plan node and its children read: returned plus filtered out, times their loops."""
    removed = plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Join Filter", 0)
    own = (plan.get("Actual Rows", 0) + removed) * plan.get("Actual Loops", 1)
    own += plan.get("Rows Removed by Index Recheck", 0)
    return int(own) + sum(rows_read(child) for child in plan.get("Plans", []))


@pytest.mark.parametrize("history_analyzed", [False, True], ids=["no-statistics", "statistics-of-the-history"])
async def test_the_instance_statements_read_only_their_rows_under_a_generic_plan_beside_a_backlog(
    pool: asyncpg.Pool, history_analyzed: bool
) -> None:
    # An instance's statements run with the generic plan PostgreSQL caches after five runs. Over a
    # backlog a wrong index (the queue's created_at index, the queued partial index) still "uses
    # an index" but reads every queued task of the queue: this counts the rows each one reads.
    # Statistics that saw only finished tasks make "status = 'running'" look empty: a plan
    # through the status index then read every running task for every written run.
    await fill_backlog(pool, history_analyzed=history_analyzed)
    queued = [r["id"] for r in await pool.fetch("SELECT id FROM tasks WHERE status = 'queued' LIMIT 100")]
    runs = await pool.fetch("SELECT id, task_id FROM task_runs WHERE status = 'running' LIMIT 100")
    run_ids, run_tasks = [r["id"] for r in runs], [r["task_id"] for r in runs]
    n = len(runs)
    statements = {
        "task_claim_many": (queued, "default", "w-1", 30.0),
        "task_list_unclaimed_queued": (queued,),
        "run_finish_many": (
            run_ids,
            run_tasks,
            ["succeeded"] * n,
            [None] * n,
            ["null"] * n,
            [0.0] * n,
            [None] * n,
            "w-1",
        ),
        "worker_heartbeat": ("w-1", "h", 1, "{}", "v", "running", 30.0, run_ids, ["job"], "{}"),
        "task_get_with_latest_run": (queued[0],),
        "run_list_by_task": (queued[0],),
        "task_cancel_queued": (queued[0],),
        "bulk_cancel": (queued,),
        "task_requeue": (queued, ["failed", "cancelled"], None, None, None, None),
        "run_reclaim_expired": (0.0, 100),
    }
    sql = queries()
    read = {}
    async with pool.acquire() as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        for name, params in statements.items():
            tx = conn.transaction()
            await tx.start()  # EXPLAIN ANALYZE runs the statement: rolled back below
            try:
                await conn.execute(f"PREPARE growth_{name} AS {sql[name]}")
                args = ", ".join(literal(p) for p in params)
                [[plan]] = await conn.fetch(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE growth_{name}({args})")
                read[name] = rows_read(json.loads(plan)[0]["Plan"])
            finally:
                await tx.rollback()
        await conn.execute("RESET plan_cache_mode")
    # Bounded by the instance's own running runs (1,000 here) at most, never by the backlog.
    assert {name: rows for name, rows in read.items() if rows >= BACKLOG // 4} == {}, read
