"""Handlers for tests that run taskmesh as a real process (TASKMESH_HANDLERS=tests.process_handlers)."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import anyio
import asyncpg

import taskmesh
from taskmesh.tasks.models import TaskContext


@taskmesh.task("sleepy")
async def sleepy(payload: dict[str, Any]) -> str:
    await anyio.sleep(float(payload.get("seconds", 0)))
    return "slept"


@taskmesh.task("slow_first")
async def slow_first(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Sleeps ``seconds`` on attempt 1 only; later attempts return at once."""
    if ctx.attempt == 1:
        await anyio.sleep(float(payload.get("seconds", 0)))
    return {"attempt": ctx.attempt, "pid": os.getpid()}


@taskmesh.task("poison")
async def poison(payload: Any) -> None:
    """Kills its own process, every time."""
    os.kill(os.getpid(), signal.SIGKILL)


_ledger_pool: asyncpg.Pool | None = None


async def _ledger() -> asyncpg.Pool:
    """The process's pool of the ledger handlers, made at their first run."""
    global _ledger_pool
    if _ledger_pool is None:
        _ledger_pool = await asyncpg.create_pool(
            os.environ["DATABASE_URL"],
            min_size=1,
            max_size=4,
            statement_cache_size=0,  # a pooler may be between
        )
    return _ledger_pool


@taskmesh.task("ledger")
async def ledger(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Records (task, attempt, pid, start, end) in the ``ledger`` table after a 0-200 ms sleep.

    Used by the chaos suite: overlapping entries of one task would mean one
    task ran twice at once.
    """
    pool = await _ledger()
    start = time.time()
    await anyio.sleep(random.uniform(0, float(payload.get("max_sleep", 0.2))))
    end = time.time()
    await pool.execute(
        "INSERT INTO ledger (task_id, attempt, pid, started, ended) VALUES ($1, $2, $3, $4, $5)",
        ctx.task_id,
        ctx.attempt,
        os.getpid(),
        start,
        end,
    )


@taskmesh.task("noop")
async def noop(payload: Any) -> None:
    """Does nothing: cron fires in the two-instance schedule test."""
    return None


@taskmesh.task("chatty", max_retries=0)
async def chatty(payload: Any) -> None:
    """Logs a line of its own, then fails: log-context and log_payloads tests."""
    import structlog

    structlog.get_logger("tests.chatty").warning("handler_said")
    raise RuntimeError("chatty always fails")


@taskmesh.task("blocks_loop")
async def blocks_loop(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Blocks the event loop with ``time.sleep(seconds)`` on attempt 1 (a bug users write); later attempts return."""
    if ctx.attempt == 1:
        time.sleep(float(payload.get("seconds", 0)))
    return {"attempt": ctx.attempt, "pid": os.getpid()}


def _mark(payload: dict[str, Any], ctx: TaskContext, what: str) -> None:
    from pathlib import Path

    Path(payload["dir"], f"attempt{ctx.attempt}.{what}").write_text(f"{os.getpid()} {time.time()}")


@taskmesh.task("sync_slow_first", timeout=0.5, max_retries=1)
def sync_slow_first(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """A ``def`` handler: attempt 1 overruns its 0.5 s timeout (it sleeps ``seconds``), later ones return."""
    _mark(payload, ctx, "start")
    if ctx.attempt == 1:
        time.sleep(float(payload.get("seconds", 3)))
    _mark(payload, ctx, "end")
    return {"attempt": ctx.attempt, "pid": os.getpid()}


@taskmesh.task("sync_sleeps")
def sync_sleeps(payload: dict[str, Any], ctx: TaskContext) -> None:
    """A ``def`` handler sleeping ``seconds`` (cancel tests)."""
    _mark(payload, ctx, "start")
    time.sleep(float(payload.get("seconds", 60)))
    _mark(payload, ctx, "end")


@taskmesh.task("thread_sleeps_first", pool="thread")
def thread_sleeps_first(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """A ``def`` handler run in a thread (never stopped): attempt 1 sleeps ``seconds``, later ones return."""
    _mark(payload, ctx, "start")
    if ctx.attempt == 1:
        time.sleep(float(payload.get("seconds", 600)))
    _mark(payload, ctx, "end")
    return {"attempt": ctx.attempt, "pid": os.getpid()}


@taskmesh.task("sync_dies_first", max_retries=2)
def sync_dies_first(payload: dict[str, Any], ctx: TaskContext) -> int:
    """A ``def`` handler whose process dies on attempt 1 (as a segfault or the OOM killer would end it)."""
    if ctx.attempt == 1:
        os._exit(3)
    return ctx.attempt


@taskmesh.task("ledger_sync")
def ledger_sync(payload: dict[str, Any], ctx: TaskContext) -> None:
    """The chaos ledger's ``def`` handler, run in a worker process: one JSON line per run in ``dir``.

    Written when the run ends (a run whose process is killed writes nothing, as the async
    ledger's insert does not happen then either).
    """
    import json
    from pathlib import Path

    start = time.time()
    time.sleep(random.uniform(0, float(payload.get("max_sleep", 0.2))))
    # The instance's pid (this process's parent): the chaos test explains a repeated run by the
    # instance it killed, and a killed instance takes its handler processes with it.
    line = {"task_id": str(ctx.task_id), "attempt": ctx.attempt, "pid": os.getppid(), "started": start}
    line["ended"] = time.time()
    with Path(payload["dir"], f"ledger-{os.getpid()}.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")


@taskmesh.task("ledger_blocking")
async def ledger_blocking(payload: dict[str, Any], ctx: TaskContext) -> None:
    """The chaos ledger's handler that blocks the event loop (``time.sleep``) for part of its run."""
    time.sleep(random.uniform(0, float(payload.get("max_block", 0.05))))
    await ledger(payload, ctx)


@taskmesh.task("wf_ledger")
async def wf_ledger(payload: dict[str, Any], ctx: TaskContext) -> Any:
    """A workflow node's run recorded in ``wf_ledger`` (node, task, attempt, pid, start, end, how many parent
    results it was handed); sleeps ``seconds`` on attempt 1 (``first_only``) or every attempt first.

    Returns its map item (or its node id), so a join can check what it was handed.
    """
    pool = await _ledger()
    start = time.time()
    seconds = float(payload.get("seconds", 0)) if isinstance(payload, dict) else 0.0
    if seconds and (ctx.attempt == 1 or not payload.get("first_only")):
        await anyio.sleep(seconds)
    handed = sum(len(v) if isinstance(v, list) else 1 for v in ctx.parents.values())
    assert ctx.workflow is not None
    await pool.execute(
        "INSERT INTO wf_ledger (node, task_id, attempt, pid, started, ended, handed)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)",
        ctx.workflow["node"],
        ctx.task_id,
        ctx.attempt,
        os.getpid(),
        start,
        time.time(),
        handed,
    )
    return payload if not isinstance(payload, dict) else ctx.workflow["node"]


@taskmesh.task("lim.ledger")
async def limit_ledger(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Records each run's start and end by PostgreSQL's clock (``clock_timestamp()``) in ``limit_ledger``,
    sleeping ``seconds`` between: the task limits' process tests count runs at once and starts from it.

    The start is written before the sleep, so a run whose instance is killed leaves a start with no end.
    """
    pool = await _ledger()
    await pool.execute(
        "INSERT INTO limit_ledger (task_id, attempt, pid, started) VALUES ($1, $2, $3, clock_timestamp())",
        ctx.task_id,
        ctx.attempt,
        os.getpid(),
    )
    await anyio.sleep(float(payload.get("seconds", 0)))
    await pool.execute(
        "UPDATE limit_ledger SET ended = clock_timestamp() WHERE task_id = $1 AND attempt = $2",
        ctx.task_id,
        ctx.attempt,
    )
