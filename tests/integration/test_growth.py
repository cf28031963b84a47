"""Growth: with a large finished history the hot queries still use indexes, and retention trims it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from taskmesh.services import retention
from taskmesh.store.postgres import queries
from taskmesh.tasks import Tasks

pytestmark = pytest.mark.anyio

HISTORY = 200_000


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
        ),
        "task_get": (ids[0],),
        "run_get_latest": (ids[0],),
        "run_list_by_task": (ids[0],),
        "task_claim_many": (ids, "default", "w-1", 30.0),
        "run_finish_many": (one, one, ["succeeded"], [None], ['"ok"'], [0.0], "w-1"),
        "worker_heartbeat": ("w-1", "h", 1, "{}", "v", "running", 30.0),
        "run_reclaim_expired": (30.0, 500),
        "task_list_failed": ("default", 50),
        "task_replay_many": ("default", 10, None),
        "task_list_queued_stale": (["default"], 5.0, 1000),
        "task_count_queued": (["default"],),
        "task_list_queued_page": (["default"], uuid.UUID(int=0), 1000),
        "task_list_not_due": (ids,),
        "task_delete_finished": ("completed", 7 * 86400.0, 1000),
        "sample_running_by_queue": (["default"],),
        "sample_failed_by_queue": (["default"],),
        "sample_oldest_ready_age": ("default",),
    }


async def test_hot_queries_use_indexes_not_scans_over_a_large_history(pool: asyncpg.Pool) -> None:
    await fill_history(pool)
    ids = [r["id"] for r in await pool.fetch("SELECT id FROM tasks WHERE name = 'live' LIMIT 32")]
    async with pool.acquire() as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")  # asyncpg reuses generic plans
        scans = {}
        for name, params in hot_queries(ids).items():
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + queries()[name], *params))
            if "Seq Scan on tasks" in plan or "Seq Scan on task_runs" in plan:
                scans[name] = plan
        await conn.execute("RESET plan_cache_mode")
    assert scans == {}


async def test_retention_deletes_old_finished_tasks_in_batches_and_keeps_live_ones(
    pool: asyncpg.Pool, tasks: Tasks
) -> None:
    await fill_history(pool)
    keep_failed = {"completed": 7 * 86400.0, "cancelled": 7 * 86400.0, "failed": 90 * 86400.0}
    deleted = await retention.run_once(tasks, keep_failed, batch=5000, max_batches=100)
    assert deleted == {"completed": HISTORY * 3 // 5, "cancelled": HISTORY // 5}
    left = dict(await pool.fetch("SELECT status, count(*) FROM tasks GROUP BY status"))
    assert left == {"failed": HISTORY // 5, "queued": 100, "running": 100}
    assert await pool.fetchval("SELECT count(*) FROM task_runs") == HISTORY // 5 + 200
