"""The fetcher claims in batches while its executors still have claimed tasks waiting.

A queue that runs a few hundred tasks a second with prefetch used to claim one task per
finished task: one commit each. While the channel holds a claimed task for every executor,
the fetcher now gathers free slots for up to ``GATHER_MAX_SECONDS`` before claiming.
"""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec
from tests.conftest import wait_for

pytestmark = pytest.mark.anyio


async def test_a_busy_queue_with_prefetch_claims_in_batches_and_no_executor_runs_short(
    start_instance: Any, registry: Registry, tasks: Tasks, pool: asyncpg.Pool
) -> None:
    running = 0
    most = 0

    @registry.task("batched.job")
    async def job(payload: Any) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await anyio.sleep(0.02)
        running -= 1

    async def all_done() -> bool:
        done: int = await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'completed'")
        return done == 300

    async with start_instance(worker_concurrency=2, prefetch=50):
        await tasks.enqueue_many([TaskSpec(name="batched.job") for _ in range(300)])
        started = anyio.current_time()
        await wait_for(all_done, timeout=60)
        elapsed = anyio.current_time() - started
    # Each claim statement stamps its runs with its own transaction's time.
    claims: int = await pool.fetchval("SELECT count(DISTINCT claimed_at) FROM task_runs")
    # One claim per finished task would be about 250; batches of about 26 free slots are about 12.
    assert claims <= 40, claims
    # The two executors never waited for a claim: 300 tasks of 20 ms, two at a time, take 3 s.
    assert most == 2
    assert elapsed < 3.0 * 2, elapsed
