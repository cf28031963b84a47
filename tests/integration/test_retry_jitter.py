"""Tasks that fail together do not retry together.

The backoff after the n-th failure is ``min(2^n, 3600)`` s times a uniform factor in
[0.5, 1.5): the executor draws it in Python (``retry.backoff_seconds``), the
reclaimer's SQL draws it for runs whose lease expired. Before, 500 tasks that failed
in the same instant were all due again 1.0 s later (416 retries in one second).
What is read is ``next_retry_at - finished_at`` of each failed run: both are written
in one statement with PostgreSQL's ``now()``, so the difference is the drawn wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.runtime import supervisor
from taskmesh.services import reclaimer
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec
from tests.conftest import wait_for

pytestmark = pytest.mark.anyio

WINDOW_SECONDS = 0.1


def most_in_one_window(waits: Sequence[float], width: float = WINDOW_SECONDS) -> int:
    """The largest number of ``waits`` inside any interval ``width`` seconds wide."""
    ordered = sorted(waits)
    most, low = 0, 0
    for high, value in enumerate(ordered):
        while value - ordered[low] > width:
            low += 1
        most = max(most, high - low + 1)
    return most


def test_most_in_one_window_counts_the_densest_interval() -> None:
    assert most_in_one_window([1.0] * 5) == 5
    assert most_in_one_window([0.5, 0.55, 0.7, 0.75, 0.79, 1.4]) == 3
    assert most_in_one_window([]) == 0


async def first_run_waits(pool: asyncpg.Pool) -> list[float | None]:
    """``next_retry_at - finished_at`` in seconds of every task's first run (``None``: no retry due)."""
    rows = await pool.fetch(
        "SELECT extract(epoch FROM next_retry_at - finished_at)::float8 AS wait FROM task_runs WHERE attempt = 1"
    )
    return [r["wait"] for r in rows]


def assert_spread(drawn: Sequence[float | None], count: int) -> None:
    """Every wait in [0.5, 1.5] s, reaching near both ends, and no 100 ms holding a fifth of them."""
    waits = [w for w in drawn if w is not None]
    assert len(waits) == len(drawn) == count, (len(waits), len(drawn))
    assert all(0.5 <= w <= 1.5 for w in waits), (min(waits), max(waits))
    # Spread over the whole range, not bunched: no 100 ms holds a fifth of them (uniform: a tenth).
    assert most_in_one_window(waits) <= count // 5, most_in_one_window(waits)
    assert min(waits) < 0.6 and max(waits) > 1.4, (min(waits), max(waits))


async def test_five_hundred_tasks_failing_together_wait_between_half_and_one_and_a_half_seconds_spread(
    start_instance: Callable[..., contextlib.AbstractAsyncContextManager[supervisor.Instance]],
    registry: Registry,
    tasks: Tasks,
    pool: asyncpg.Pool,
) -> None:
    @registry.task("fails_at_once", max_retries=1)
    async def fails_at_once(payload: Any) -> None:
        raise RuntimeError("down")

    async def first_runs_failed() -> bool:
        failed: int = await pool.fetchval(
            "SELECT count(*) FROM task_runs WHERE attempt = 1 AND finished_at IS NOT NULL"
        )
        return failed == 500

    with anyio.fail_after(60):
        async with start_instance(worker_concurrency=250, prefetch=250):
            await tasks.enqueue_many([TaskSpec(name="fails_at_once") for _ in range(500)])
            await wait_for(first_runs_failed, timeout=30)
    # The premise: they failed together (within a few seconds; without jitter they would all
    # be due again within that same span, 1.0 s later).
    span: float = await pool.fetchval(
        "SELECT extract(epoch FROM max(finished_at) - min(finished_at))::float8 FROM task_runs WHERE attempt = 1"
    )
    assert span < 3.0, span
    assert_spread(await first_run_waits(pool), 500)


async def test_two_hundred_expired_leases_reclaimed_at_once_wait_between_half_and_one_and_a_half_seconds_spread(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    # The reclaimer spares every run for one lease after PostgreSQL started (a fresh embedded one).
    uptime: float = await pool.fetchval("SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8")
    if uptime < 1.5:
        await anyio.sleep(1.5 - uptime)
    made = await tasks.enqueue_many([TaskSpec(name="held_by_a_dead_worker", max_retries=1) for _ in range(200)])
    claimed = await tasks.claim("default", [str(m.task_id) for m in made], "dead-worker", 30)
    assert len(claimed) == 200
    # Their worker died: every lease ran out a moment ago.
    await pool.execute("UPDATE task_runs SET lease_expires_at = now() - interval '1 second' WHERE status = 'running'")
    assert await reclaimer.run_once(tasks, lease_seconds=1) == {"queued": 200}
    rows = await pool.fetch("SELECT status, error, finished_at FROM task_runs")
    assert {(r["status"], r["error"]) for r in rows} == {("retrying", "lease expired")}
    assert len({r["finished_at"] for r in rows}) == 1  # one statement: reclaimed in the same instant
    assert_spread(await first_run_waits(pool), 200)
