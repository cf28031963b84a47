"""``python -m benchmarks.growth --rows N``: what a long history costs the hot paths.

Run it from the repository root (``make growth ARGS="--rows 1000000"``). It creates the
database ``taskmesh_growth`` (``--database``) on the PostgreSQL of ``DATABASE_URL`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``) and fills it with ``--rows`` finished tasks
and their runs, all 100 days old: half completed, 40% dead-lettered (in four queues, due for
the default 90-day retention) and 10% cancelled. Then, with one instance running on it (the
handler module ``benchmarks.bench_handler``, Redis of ``REDIS_URL``), it measures:

1. ``POST /api/v1/tasks`` at a steady 200 requests/s, 1,000 of them: p50 / p95 / p99 ms;
2. the sampler's dead-letter count of the four queues (``task_sample_failed_by_queue``, once the
   fill's deltas are folded, 10,000 a statement as the sampler does, and their table vacuumed;
   also before that vacuum), and what counting the failed rows themselves takes (the query it
   replaced), ms;
3. one retention batch of 1,000 dead-lettered tasks (``task_delete_failed``, rolled back), ms;
4. dead-lettering 1,000 ids into a queue's DLQ mirror that already holds 10,000, ms;
5. the instance's RSS.

Every figure is measured in this run. The database is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from typing import Any

import asyncpg
import httpx

from benchmarks.bench import Bench, _free_port, database_name, wait_ready
from benchmarks.measure import pct, rss_kib
from taskmesh.store.keys import DLQ_MIRROR_MAX, Keys
from taskmesh.store.postgres import migrate_url, queries
from taskmesh.store.redis import RedisStore

GROWTH_DB = "taskmesh_growth"
CHUNK = 500_000
QUEUES = ["q0", "q1", "q2", "q3"]
OLD_COUNT = "SELECT queue, count(*) AS n FROM tasks WHERE status = 'failed' AND queue = ANY($1::text[]) GROUP BY queue"


async def fill(url: str, rows: int) -> float:
    """Insert ``rows`` finished tasks and their runs in chunks; returns the seconds it took."""
    conn = await asyncpg.connect(url)
    t0 = time.perf_counter()
    try:
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            await conn.execute(
                """WITH t AS (
                       INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at,
                                          attempts, created_at, updated_at)
                       SELECT gen_random_uuid(), 'report.export', 'immediate', 'q' || (g % 4), 0,
                              jsonb_build_object('customer', g % 1000), 3,
                              CASE WHEN g % 10 < 5 THEN 'completed' WHEN g % 10 < 9 THEN 'failed' ELSE 'cancelled' END,
                              now() - interval '100 days', 1, now() - interval '100 days',
                              now() - interval '100 days' + g * interval '1 ms'
                       FROM generate_series($1::bigint, $2::bigint) g
                       RETURNING id, status, updated_at
                   )
                   INSERT INTO task_runs (id, task_id, attempt, status, finished_at, error)
                   SELECT taskmesh_run_id(id, 1), id, 1,
                          CASE status WHEN 'completed' THEN 'succeeded' ELSE 'failed' END,
                          updated_at, CASE status WHEN 'completed' THEN NULL ELSE 'boom' END
                   FROM t""",
                start,
                start + n - 1,
            )
            print(f"  filled {start + n:,} of {rows:,} ({time.perf_counter() - t0:.0f} s)", flush=True)
        await conn.execute("VACUUM ANALYZE tasks")
        await conn.execute("VACUUM ANALYZE task_search")
        await conn.execute("VACUUM ANALYZE task_runs")
    finally:
        await conn.close()
    return time.perf_counter() - t0


async def timed(conn: asyncpg.Connection, sql: str, *args: Any, runs: int = 5) -> float:
    """The median of ``runs`` runs of ``sql`` (a prepared statement), in ms, each rolled back."""
    stmt = await conn.prepare(sql)
    took = []
    for _ in range(runs):
        tx = conn.transaction()
        await tx.start()
        t0 = time.perf_counter()
        await stmt.fetch(*args)
        took.append((time.perf_counter() - t0) * 1000)
        await tx.rollback()
    return sorted(took)[len(took) // 2]


async def statements(url: str) -> dict[str, float]:
    """The per-statement figures (2 and 3 of the module docs)."""
    sql = queries()
    conn = await asyncpg.connect(url)
    try:
        t0 = time.perf_counter()
        while await conn.fetchval(sql["dead_letter_count_compact"], 10_000):  # as the sampler folds them
            pass
        folded = time.perf_counter() - t0
        before_vacuum = await timed(conn, sql["task_sample_failed_by_queue"], QUEUES)
        await conn.execute("VACUUM dead_letter_deltas")  # what autovacuum does soon after (migration 0018)
        return {
            "dead_letter_count_unvacuumed_ms": before_vacuum,
            "dead_letter_count_ms": await timed(conn, sql["task_sample_failed_by_queue"], QUEUES),
            "counting_failed_rows_ms": await timed(conn, OLD_COUNT, QUEUES),
            "retention_batch_ms": await timed(conn, sql["task_delete_failed"], 90 * 86400.0, 1000),
            "folding_seconds": folded,
        }
    finally:
        await conn.close()


async def dlq_mirror(redis_url: str) -> float:
    """ms to dead-letter 1,000 ids one call each into a mirror already holding :data:`DLQ_MIRROR_MAX`."""
    prefix = f"tmgrowth-{uuid.uuid4().hex[:8]}"
    store = RedisStore.connect(redis_url, Keys(prefix))
    try:
        full = [str(uuid.uuid4()) for _ in range(DLQ_MIRROR_MAX)]
        for start in range(0, len(full), 1000):
            await store.dead_letter("q0", full[start : start + 1000])
        t0 = time.perf_counter()
        for _ in range(1000):
            await store.dead_letter("q0", [str(uuid.uuid4())])
        return (time.perf_counter() - t0) * 1000
    finally:
        await store.client.delete(store.keys.dlq("q0"))
        await store.close()


async def posts(bench: Bench) -> tuple[tuple[float, float, float], float]:
    """POST latency at 200/s with an instance on the grown database, and its RSS in MiB."""
    port = _free_port()
    proc = bench.start_instance(32, port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await wait_ready(http)
            for _ in range(200):  # warm-up: connections, prepared statements
                (await http.post("/api/v1/tasks", json={"name": "bench.noop"})).raise_for_status()
            latencies = []
            t0 = time.perf_counter()
            for i in range(1000):
                await asyncio.sleep(max(0.0, t0 + i / 200 - time.perf_counter()))
                s = time.perf_counter()
                (await http.post("/api/v1/tasks", json={"name": "bench.noop", "payload": {"i": i}})).raise_for_status()
                latencies.append((time.perf_counter() - s) * 1000)
        return (pct(latencies, 0.5), pct(latencies, 0.95), pct(latencies, 0.99)), rss_kib(proc.pid) / 1024
    finally:
        bench.stop_instance(proc)


async def run(args: argparse.Namespace) -> None:
    database = args.database
    bench = Bench(
        argparse.Namespace(pgbouncer=None, redis_cluster=None, prefetch=128, concurrency=32, database=database)
    )
    admin = await asyncpg.connect(bench.admin_url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {database}")
        await migrate_url(bench.db_url)
        print(f"taskmesh growth: {args.rows:,} finished tasks of history")
        filled = await fill(bench.db_url, args.rows)
        figures = await statements(bench.db_url)
        (p50, p95, p99), rss = await posts(bench)
        mirror = await dlq_mirror(bench.redis_url)
        size = await admin.fetchval("SELECT pg_size_pretty(pg_database_size($1))", database)
    finally:
        if not args.keep:
            await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await admin.close()
    print(f"  history                 {args.rows:,} tasks and runs, {size}, filled in {filled:.0f} s")
    print(f"  POST /api/v1/tasks      at 200/s: p50 {p50:.2f} / p95 {p95:.2f} / p99 {p99:.2f} ms")
    print(
        f"  dead-letter count       {figures['dead_letter_count_ms']:.2f} ms for 4 queues "
        f"(counting the failed rows: {figures['counting_failed_rows_ms']:.1f} ms; "
        f"folding the fill's deltas took {figures['folding_seconds']:.1f} s, and a count before the "
        f"folded deltas were vacuumed {figures['dead_letter_count_unvacuumed_ms']:.2f} ms)"
    )
    print(f"  retention batch         {figures['retention_batch_ms']:.1f} ms for 1,000 dead-lettered tasks")
    print(f"  DLQ mirror              {mirror / 1000:.3f} ms per dead-lettered id (mirror full: {DLQ_MIRROR_MAX:,})")
    print(f"  instance RSS            {rss:.1f} MiB")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.growth``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.growth", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished tasks of history (default 1,000,000)")
    parser.add_argument(
        "--database",
        type=database_name,
        default=GROWTH_DB,
        help="the database it DROPS (with FORCE) and fills; also the Redis key prefix of its instance",
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TASKMESH_LOG_LEVEL", "warning")
    sys.exit(main())
