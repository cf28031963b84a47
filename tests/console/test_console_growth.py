"""Every console page over a long history: each page, timed end to end over HTTP.

``CONSOLE_HISTORY`` tasks (default 30,000; the issue's figure is measured with 1,000,000:
``CONSOLE_HISTORY=1000000 .venv/bin/python -m pytest tests/console/test_console_growth.py -s``)
in 20 queues, as ``test_search_growth.py`` fills them, with ``CONSOLE_ROLLUP_DAYS`` (default 2;
30 for the figure) of per-minute rollup rows for every queue. Each page is read by a
signed-in session five times and the median is printed. The tables are vacuumed after the fill,
as autovacuum leaves them once they settle (without it, every count also reads the heap). Speed is
not asserted (this machine's speed varies by 3x); every page must answer 200 with its content.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import asyncpg
import httpx
import pytest

from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from tests.console.test_console_sessions import signed_in
from tests.integration.test_search_growth import fill

pytestmark = pytest.mark.anyio

CONSOLE_HISTORY = int(os.environ.get("CONSOLE_HISTORY", "30000"))
CONSOLE_ROLLUP_DAYS = int(os.environ.get("CONSOLE_ROLLUP_DAYS", "2"))


async def fill_rollup(pool: asyncpg.Pool, days: int) -> None:
    await pool.execute(
        """INSERT INTO queue_minutes
               (queue, minute, succeeded, failed, wait_counts, ready_max, oldest_ready_max_seconds)
           SELECT 'q' || q, date_trunc('minute', now()) - m * interval '1 minute', 50 + m % 30, m % 3,
                  ARRAY[0, 5, 9, 20, 10, 4, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]::bigint[],
                  m % 200, (m % 60)::float8
           FROM generate_series(0, 19) q, generate_series(0, $1::int * 1440 - 1) m""",
        days,
    )
    await pool.execute(  # the rows of every queue together, as the instances' samplers add them
        """INSERT INTO queue_minutes (queue, minute, succeeded, failed, wait_counts)
           SELECT '*', minute, sum(succeeded), sum(failed), ARRAY[0, 100, 180, 400, 200, 80, 40, 20, 0, 0, 0, 0, 0,
                  0, 0, 0, 0, 0, 0, 0, 0]::bigint[]
           FROM queue_minutes GROUP BY minute"""
    )
    await pool.execute("ANALYZE queue_minutes")


async def test_every_page_answers_over_a_long_history(start_instance: Any, stores: Any, pool: asyncpg.Pool) -> None:
    t0 = time.monotonic()
    await fill(pool, CONSOLE_HISTORY)
    await fill_rollup(pool, CONSOLE_ROLLUP_DAYS)
    for table in ("tasks", "task_runs", "queue_minutes"):
        # As autovacuum leaves a settled table: its visibility map set, so counts read the indexes only.
        await pool.execute(f"VACUUM ANALYZE {table}")
    filled = time.monotonic() - t0
    some_task = await pool.fetchval("SELECT id FROM tasks WHERE status = 'failed' ORDER BY created_at LIMIT 1")
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    pages = {
        "overview (last hour)": ("/console/overview", "Runs ended"),
        "overview (last day)": ("/console/overview?window=day", "Runs ended"),
        "queues": ("/console/queues", "q7"),
        "limits": ("/console/limits", "per_customer"),
        "tasks, newest": ("/console/tasks", "tasks on this page"),
        "tasks, failed": ("/console/tasks?status=failed", "tasks on this page"),
        "tasks, queue and failed": ("/console/tasks?queue=q7&status=failed", "tasks on this page"),
        "tasks, payload field": ("/console/tasks?payload.customer.id=42", "tasks on this page"),
        "tasks, error text": ("/console/tasks?error=host+42", "Tasks"),
        "task": (f"/console/tasks/{some_task}", "Attempt 1"),
        "task payload": (f"/console/tasks/{some_task}/data", "customer"),
        "dead letters": ("/console/dlq", "q7"),
        "dead letters of a queue": ("/console/dlq/q7", "dead-lettered tasks, oldest first"),
        "workers": ("/console/workers", "Workers"),
        "schedules": ("/console/schedules", "Schedules"),
        "audit log": ("/console/audit", "console.sign_in"),
    }
    lines = []
    limits = {"rate_limit_read_per_second": 100000.0}
    task_limits = {
        "api": {"queue": "q7", "concurrency": 10},
        "per_customer": {"key": "payload.customer.id", "rate": "5/s"},
    }
    async with start_instance(workers_enabled=False, queue_names=["q7"], limits=task_limits, **limits) as inst:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{inst.port}", timeout=60) as client:
            await signed_in(client, admin)
            for name, (path, expected) in pages.items():
                timings = []
                for _ in range(5):
                    t = time.perf_counter()
                    page = await client.get(path)
                    timings.append((time.perf_counter() - t) * 1000)
                    assert page.status_code == 200, (name, page.status_code, page.text[:500])
                    assert expected in page.text, (name, expected)
                lines.append(f"| {name} | `{path}` | {statistics.median(timings):.0f} ms | {max(timings):.0f} ms |")
    print(
        f"\n{CONSOLE_HISTORY:,} tasks and {CONSOLE_ROLLUP_DAYS} days of rollup for 20 queues, filled in {filled:.0f} s"
    )
    print("| page | path | median of 5 | slowest |\n| --- | --- | --- | --- |")
    print("\n".join(lines))
