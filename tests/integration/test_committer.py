"""The committer against real PostgreSQL: a value it refuses is isolated, everything else is written."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.services.committer import Committer
from taskmesh.tasks.models import ClaimedTask, Outcome, RunResult
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import parse_task_spec

pytestmark = pytest.mark.anyio

WORKER = "committer-test"


async def claimed(tasks: Tasks, n: int) -> list[ClaimedTask]:
    ids = [str((await tasks.enqueue(parse_task_spec({"name": "t", "max_retries": 2}))).task_id) for _ in range(n)]
    return await tasks.claim("default", ids, WORKER, 30)


async def commit(committer: Committer, results: list[RunResult]) -> None:
    for result in results:
        await committer.submit(result)
    committer.close()
    with anyio.fail_after(10):
        await committer.run()


async def test_a_batch_with_one_value_postgresql_refuses_writes_the_rest_and_fails_that_run(
    tasks: Tasks, pool: asyncpg.Pool
) -> None:
    runs = await claimed(tasks, 9)
    # A result text that gets past storable.py (it is built by hand): PostgreSQL's jsonb refuses \u0000.
    poison = RunResult(runs[4], Outcome.SUCCEEDED, result='"\\u0000"')
    results = [RunResult(t, Outcome.SUCCEEDED, result='"ok"') for t in runs[:4]] + [poison]
    results += [RunResult(t, Outcome.RETRY, error="boom", delay_seconds=0.5) for t in runs[5:]]
    committer = Committer(tasks, WORKER, batch_size=100, flush_ms=50)
    await commit(committer, results)
    rows = {r["id"]: r for r in await pool.fetch("SELECT id, status FROM tasks")}
    assert [rows[t.task_id]["status"] for t in runs] == ["completed"] * 4 + ["failed"] + ["queued"] * 4
    error = await pool.fetchval("SELECT error FROM task_runs WHERE id = $1", runs[4].run_id)
    assert error == (
        "the handler's result could not be stored: UntranslatableCharacterError: unsupported Unicode escape sequence"
    )
    assert committer.unwritten == {}


async def test_a_failed_run_whose_error_postgresql_refuses_keeps_its_outcome(tasks: Tasks, pool: asyncpg.Pool) -> None:
    [run] = await claimed(tasks, 1)
    # Not something the executor makes (storable.py escapes errors), but what an older version might send.
    bad = RunResult(run, Outcome.RETRY, error="x\x00y", delay_seconds=0.2)
    committer = Committer(tasks, WORKER)
    await commit(committer, [bad])
    row: Any = await pool.fetchrow("SELECT status, error FROM task_runs WHERE id = $1", run.run_id)
    assert row["status"] == "retrying"
    assert row["error"].startswith("the run's error could not be stored: ")
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", run.task_id) == "queued"


async def test_results_held_by_the_committer_count_as_held_until_written(tasks: Tasks) -> None:
    runs = await claimed(tasks, 3)
    committer = Committer(tasks, WORKER, flush_ms=1000)
    for t in runs:
        await committer.submit(RunResult(t, Outcome.SUCCEEDED, result="1"))
    assert set(committer.unwritten) == {t.run_id for t in runs}  # the heartbeat keeps these leases
    committer.close()
    with anyio.fail_after(10):
        await committer.run()
    assert committer.unwritten == {}


async def test_a_steady_stream_is_written_once_per_interval_and_a_lone_result_at_once(
    tasks: Tasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = await claimed(tasks, 41)
    writes: list[int] = []
    finish = tasks.finish

    async def counted(batch: list[RunResult], worker_id: str) -> None:
        writes.append(len(batch))
        await finish(batch, worker_id)

    monkeypatch.setattr(tasks, "finish", counted)
    committer = Committer(tasks, WORKER, flush_ms=1, interval_ms=200)

    async def written() -> None:
        while committer.unwritten:
            await anyio.sleep(0.005)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(committer.run)
            began = anyio.current_time()
            for t in runs[:40]:  # one result every 10 ms: without the interval, one write each
                await committer.submit(RunResult(t, Outcome.SUCCEEDED, result="1"))
                await anyio.sleep(0.01)
            streamed = anyio.current_time() - began
            await written()
            stream_writes = len(writes)
            await anyio.sleep(0.3)  # a quiet spell longer than the interval
            lone = anyio.current_time()
            await committer.submit(RunResult(runs[40], Outcome.SUCCEEDED, result="1"))
            await written()
            lone = anyio.current_time() - lone
            committer.close()
    assert sum(writes) == 41
    assert stream_writes <= streamed / 0.2 + 2, (writes, streamed)
    assert lone < 0.15  # flush_ms after a quiet spell, not the interval
