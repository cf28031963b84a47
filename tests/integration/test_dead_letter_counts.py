"""The dead-letter count of each queue (migration 0018): kept by triggers, read without counting rows."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import asyncpg
import pytest

from taskmesh.tasks.tasks import Tasks

pytestmark = pytest.mark.anyio

QUEUES = ["a", "b", "c"]


async def actual(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT queue, count(*) AS n FROM tasks WHERE status = 'failed' GROUP BY queue")
    return {r["queue"]: r["n"] for r in rows}


async def insert(pool: asyncpg.Pool, queue: str, status: str, n: int) -> None:
    await pool.execute(
        """INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at)
           SELECT gen_random_uuid(), 'job', 'immediate', $1, 0, 'null', 3, $2, now() FROM generate_series(1, $3)""",
        queue,
        status,
        n,
    )


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {q: n for q, n in counts.items() if n}


async def test_every_way_into_and_out_of_failed_is_counted_before_and_after_compaction(
    pool: asyncpg.Pool, tasks: Tasks
) -> None:
    await insert(pool, "a", "failed", 5)  # inserted failed
    await insert(pool, "b", "running", 4)
    await insert(pool, "c", "completed", 2)
    await pool.execute("UPDATE tasks SET status = 'failed' WHERE queue = 'b'")  # dead-lettered
    await pool.execute("UPDATE tasks SET status = 'queued' WHERE id = (SELECT id FROM tasks WHERE queue = 'a' LIMIT 1)")
    await pool.execute("UPDATE tasks SET queue = 'c' WHERE id = (SELECT id FROM tasks WHERE queue = 'b' LIMIT 1)")
    await pool.execute("DELETE FROM tasks WHERE id = (SELECT id FROM tasks WHERE queue = 'b' LIMIT 1)")
    await pool.execute("UPDATE tasks SET updated_at = now() WHERE status = 'failed'")  # no change of state
    want = await actual(pool)
    assert want == {"a": 4, "b": 2, "c": 1}
    assert nonzero(await tasks.pg.tasks.sample_failed_by_queue(QUEUES)) == want
    assert await tasks.pg.tasks.compact_dead_letter_counts() > 0
    assert await pool.fetchval("SELECT count(*) FROM dead_letter_deltas") == 0
    assert nonzero(await tasks.pg.tasks.sample_failed_by_queue(QUEUES)) == want
    await pool.execute("DELETE FROM tasks WHERE queue = 'a'")
    assert nonzero(await tasks.pg.tasks.sample_failed_by_queue(QUEUES)) == {"b": 2, "c": 1}
    depths = {r["queue"]: r["dead_letter"] for r in await tasks.pg.queues.depths(QUEUES)}
    assert depths == {"a": 0, "b": 2, "c": 1}
    await pool.execute("TRUNCATE tasks CASCADE")
    assert nonzero(await tasks.pg.tasks.sample_failed_by_queue(QUEUES)) == {}


async def test_concurrent_dead_lettering_and_compactions_lose_no_count(pool: asyncpg.Pool, tasks: Tasks) -> None:
    await insert(pool, "a", "running", 600)
    await insert(pool, "b", "running", 600)
    ids = [(r["id"], r["queue"]) for r in await pool.fetch("SELECT id, queue FROM tasks ORDER BY id")]

    async def fail(part: list[tuple[object, str]]) -> None:
        for start in range(0, len(part), 50):  # batches that span both queues, in no set order
            batch = [i for i, _ in part[start : start + 50]]
            await pool.execute("UPDATE tasks SET status = 'failed' WHERE id = ANY($1::uuid[])", batch)

    async def compact() -> None:
        for _ in range(20):
            await tasks.pg.tasks.compact_dead_letter_counts(most=100)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for k in range(3):
            tg.start_soon(fail, ids[k::3])
        tg.start_soon(compact)
        tg.start_soon(compact)
    assert nonzero(await tasks.pg.tasks.sample_failed_by_queue(QUEUES)) == {"a": 600, "b": 600}
    while await tasks.pg.tasks.compact_dead_letter_counts():
        pass
    folded = await pool.fetch("SELECT queue, n FROM dead_letter_counts ORDER BY queue")
    assert [(r["queue"], r["n"]) for r in folded] == [("a", 600), ("b", 600)]


async def test_a_compaction_folds_batches_until_none_is_left_or_its_rounds_are_spent(
    pool: asyncpg.Pool, tasks: Tasks
) -> None:
    await insert(pool, "a", "failed", 250)
    assert await tasks.pg.tasks.compact_dead_letter_counts(most=100, rounds=2) == 200
    assert await pool.fetchval("SELECT count(*) FROM dead_letter_deltas") == 50
    assert nonzero(await tasks.pg.tasks.sample_failed_by_queue(QUEUES)) == {"a": 250}
    assert await tasks.pg.tasks.compact_dead_letter_counts(most=100, rounds=5) == 50
    assert nonzero(await tasks.pg.tasks.sample_failed_by_queue(QUEUES)) == {"a": 250}
