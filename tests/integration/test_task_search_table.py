"""``task_search`` follows ``tasks`` on every path that adds, moves or removes a task (migration 0020).

The search's windows for the keys that never change (all, queue, name, tenant) range over
``task_search``, kept by triggers: an enqueue through INSERT and through COPY, a requeue
into another queue, one finished task deleted, retention's batches and a TRUNCATE each
leave it holding exactly the ``(created_at, id, queue, name, tenant_id)`` of every task.
"""

from __future__ import annotations

import asyncpg
import pytest

from taskmesh.services import retention
from taskmesh.tasks.copy_enqueue import COPY_MIN_TASKS
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec

pytestmark = pytest.mark.anyio

KEYS = "created_at, id, queue, name, tenant_id"


async def mismatch(pool: asyncpg.Pool) -> tuple[int, int]:
    """Rows of ``tasks`` missing from ``task_search``, and rows of ``task_search`` with no such task."""
    missing = await pool.fetchval(
        f"SELECT count(*) FROM (SELECT {KEYS} FROM tasks EXCEPT SELECT {KEYS} FROM task_search) m"
    )
    extra = await pool.fetchval(
        f"SELECT count(*) FROM (SELECT {KEYS} FROM task_search EXCEPT SELECT {KEYS} FROM tasks) e"
    )
    return int(missing), int(extra)


async def test_every_enqueue_path_writes_one_search_row_per_task(tasks: Tasks, pool: asyncpg.Pool) -> None:
    await tasks.enqueue(TaskSpec(name="one", queue_name="q1", tenant_id="t1"))
    await tasks.enqueue_many([TaskSpec(name="few", queue_name="q2", dedup_key=f"k{i}") for i in range(3)])
    # a repeated dedup key writes nothing, so no second search row either
    await tasks.enqueue_many([TaskSpec(name="few", queue_name="q2", dedup_key="k0")])
    copied = await tasks.enqueue_mappings(
        [{"name": "bulk", "queue_name": "q3", "payload": {"i": i}} for i in range(COPY_MIN_TASKS + 6)]
    )
    assert len(copied) == COPY_MIN_TASKS + 6
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1 + 3 + COPY_MIN_TASKS + 6
    assert await mismatch(pool) == (0, 0)


async def test_a_requeue_into_another_queue_moves_the_search_row(tasks: Tasks, pool: asyncpg.Pool) -> None:
    [done] = await tasks.enqueue_many([TaskSpec(name="moved", queue_name="from")])
    await pool.execute("UPDATE tasks SET status = 'failed' WHERE id = $1", done.task_id)
    requeued = await tasks.pg.tasks.requeue([done.task_id], ["failed"], to_queue="to")
    assert [r["queue"] for r in requeued] == ["to"]
    assert await pool.fetchval("SELECT queue FROM task_search WHERE id = $1", done.task_id) == "to"
    assert await mismatch(pool) == (0, 0)


async def test_deleted_tasks_leave_the_search_table(tasks: Tasks, pool: asyncpg.Pool) -> None:
    made = await tasks.enqueue_many([TaskSpec(name="old", queue_name="q") for _ in range(30)])
    await pool.execute(
        "UPDATE tasks SET status = 'completed', updated_at = now() - interval '30 days' WHERE id = ANY($1::uuid[])",
        [e.task_id for e in made[1:]],
    )
    await pool.execute("UPDATE tasks SET status = 'completed' WHERE id = $1", made[0].task_id)
    assert await tasks.pg.tasks.delete_one_finished(made[0].task_id) is not None
    deleted = await retention.run_once(
        tasks.pg, {"completed": 86400.0, "cancelled": 86400.0, "failed": 86400.0}, batch=10
    )
    assert deleted["completed"] == 29
    assert await pool.fetchval("SELECT count(*) FROM task_search") == 0
    await tasks.enqueue_many([TaskSpec(name="kept", queue_name="q") for _ in range(2)])
    await pool.execute("TRUNCATE tasks CASCADE")
    assert await pool.fetchval("SELECT count(*) FROM task_search") == 0


async def test_retention_deletes_search_rows_by_primary_key_after_the_table_grew(
    pool: asyncpg.Pool, database_url: str
) -> None:
    # A session plans the trigger's delete once; planned while task_search was small, it must
    # still look rows up by primary key once the table is large (no new statistics meanwhile).
    fill = """INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at,
                                 created_at, updated_at)
              SELECT gen_random_uuid(), 'old', 'immediate', 'q', 0, '{}', 3, 'completed', now(),
                     now() - g * interval '1 second', now() - interval '30 days' - g * interval '1 second'
              FROM generate_series(1, $1::int) g"""
    delete = "DELETE FROM tasks WHERE id = ANY(ARRAY(SELECT id FROM tasks WHERE status = 'completed' LIMIT 50))"
    plans: list[str] = []
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(fill, 200)
        await conn.execute("ANALYZE tasks; ANALYZE task_search")
        await conn.execute(delete)  # the first plan, over 200 rows
        await conn.execute(fill, 20_000)
        await conn.execute("LOAD 'auto_explain'")
        await conn.execute(
            "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
            " SET auto_explain.log_level = notice"
        )
        conn.add_log_listener(lambda _c, message: plans.append(str(message)))
        await conn.execute(delete)
    finally:
        await conn.close()
    [trigger_plan] = [p for p in plans if "task_search" in p]
    assert "Index Scan using task_search_pkey" in trigger_plan, trigger_plan
    assert await pool.fetchval("SELECT count(*) FROM task_search") == 200 + 20_000 - 100
