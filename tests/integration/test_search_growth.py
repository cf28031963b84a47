"""How the task search behaves over a long history: every filter's first page, timed.

``SEARCH_HISTORY`` tasks (default 200,000; the issue's figure is measured with
1,000,000: ``SEARCH_HISTORY=1000000 .venv/bin/python -m pytest
tests/integration/test_search_growth.py -s``) in 20 queues, 50 names, 6 statuses,
a tenant on one in ten, a customer id in every payload and an error on every failed
run. Each filter's first page is read five times; the median is printed. Speed is
not asserted (this machine's speed varies by 3x); what is asserted is that every
page answers correctly, which a scan of the history would also do, so the plans
are checked by ``test_growth.py``.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import asyncpg
import pytest

from taskmesh.store import PgStore
from taskmesh.tasks.search import parse_search, search

pytestmark = pytest.mark.anyio

SEARCH_HISTORY = int(os.environ.get("SEARCH_HISTORY", "200000"))


async def fill(pool: asyncpg.Pool, n: int) -> None:
    await pool.execute(
        f"""INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at,
                               created_at, updated_at, tenant_id, idempotency_key)
            SELECT gen_random_uuid(), 'job.' || (g % 50), 'immediate', 'q' || (g % 20), 0,
                   jsonb_build_object('customer', jsonb_build_object('id', g % 10000)), 3,
                   (ARRAY['completed', 'completed', 'completed', 'failed', 'cancelled', 'queued'])[1 + g % 6],
                   now(), now() - g * interval '1 second', now() - g * interval '1 second',
                   CASE WHEN g % 10 = 0 THEN 't' || (g % 7) END, 'key-' || g
            FROM generate_series(1, {n}) g"""
    )
    await pool.execute(
        """INSERT INTO task_runs (task_id, attempt, status, error, finished_at)
           SELECT id, 1, CASE status WHEN 'failed' THEN 'failed' WHEN 'queued' THEN 'queued' ELSE 'succeeded' END,
                  CASE status WHEN 'failed' THEN 'ConnectionError: host ' || (abs(hashtext(id::text)) % 100) END,
                  updated_at
           FROM tasks"""
    )
    await pool.execute("ANALYZE tasks")
    await pool.execute("ANALYZE task_search")
    await pool.execute("ANALYZE task_runs")


CASES: dict[str, list[tuple[str, str]]] = {
    "newest": [],
    "oldest": [("order", "asc")],
    "status failed": [("status", "failed")],
    "queue": [("queue", "q7")],
    "name and status": [("name", "job.3"), ("status", "failed")],
    "tenant": [("tenant_id", "t3")],
    "dedup key": [("dedup_key", "key-4242")],
    "payload": [("payload.customer.id", "42")],
    "error": [("error", "host 42")],
    "created range": [("created_after", "2026-01-01T00:00:00Z")],
    "finished after, failed": [("status", "failed"), ("finished_after", "2020-01-01T00:00:00Z")],
}


async def test_every_filter_answers_its_first_page_over_a_long_history(pool: asyncpg.Pool) -> None:
    t0 = time.monotonic()
    await fill(pool, SEARCH_HISTORY)
    filled = time.monotonic() - t0
    pg = PgStore(pool)
    lines = []
    for case, params in CASES.items():
        f, order, start, limit = parse_search(params)
        timings = []
        for _ in range(5):
            t = time.perf_counter()
            page: dict[str, Any] = await search(pg, f, order, start, limit)
            timings.append((time.perf_counter() - t) * 1000)
        found = len(page["tasks"])
        lines.append(f"  {case:<24} {statistics.median(timings):8.1f} ms  {found:3d} tasks  partial={page['partial']}")
        if case == "dedup key":
            assert found == 1 and page["tasks"][0]["dedup_key"] == "key-4242"
        else:
            assert found > 0 or page["partial"], case
        if case == "status failed":
            assert {t["status"] for t in page["tasks"]} == {"failed"} and found == 50
        if case == "error":
            assert all("host 42" in t["latest_run"]["error"] for t in page["tasks"])
    print(f"\nsearch over {SEARCH_HISTORY:,} tasks (filled in {filled:.0f} s), first page, median of 5:")
    print("\n".join(lines))
