"""The benchmark's handlers: ``python -m benchmarks.bench`` has its instance load ``benchmarks.bench_handler``.

``bench.noop``'s body is the peers harness's job body (``shared/bench/peers/common.py``):
one pipelined Redis round trip, ``HINCRBY ran <id> 1`` and ``HSETNX start <id> <time>``,
so taskmesh and the peers pay for the same recorder and the benchmark can check that
every task ran exactly once. ``bench.spin`` is a ``def`` handler (it runs in the
instance's handler processes) that burns ``payload["ms"]`` milliseconds of pure Python,
then records the same way. ``bench.empty`` does nothing at all (``--empty-handler``).
``bench.fanout`` returns the list ``range(payload["n"])``: the root of ``benchmarks.workflows``'s
fan-out, whose map node makes one task per item.
"""

from __future__ import annotations

import os
import time

import redis
import redis.asyncio as aioredis

import taskmesh
from taskmesh.tasks.models import TaskContext


def recorder_keys(base: str) -> tuple[str, str]:
    """The recorder's two hashes for a bench run whose database is ``base``: runs per task, first start per task."""
    return f"{base}:ran", f"{base}:start"


# The bench names them after its --database, so that two runs on other databases keep apart.
RAN, START = recorder_keys(os.environ.get("TASKMESH_BENCH_RECORDER_KEYS", "taskmesh_bench"))
_client: aioredis.Redis | None = None
_sync_client: redis.Redis | None = None


@taskmesh.task("bench.noop")
async def noop(payload: object, ctx: TaskContext) -> None:
    """Record that this task ran, and when it started (seconds since the epoch)."""
    global _client
    if _client is None:
        _client = aioredis.Redis.from_url(os.environ["TASKMESH_BENCH_RECORDER_URL"])
    pipe = _client.pipeline(transaction=False)
    pipe.hincrby(RAN, str(ctx.task_id), 1)
    pipe.hsetnx(START, str(ctx.task_id), repr(time.time()))
    await pipe.execute()


@taskmesh.task("bench.empty")
async def empty(payload: object, ctx: TaskContext) -> None:
    """Nothing: ``--empty-handler`` drains these, to measure what taskmesh itself costs per task."""


@taskmesh.task("bench.fanout")
async def fanout(payload: dict[str, int], ctx: TaskContext) -> list[int]:
    """The items a map over this node's result fans out to: ``payload["n"]`` integers from 0."""
    return list(range(payload["n"]))


@taskmesh.task("bench.spin")
def spin(payload: dict[str, float], ctx: TaskContext) -> None:
    """Burn ``payload["ms"]`` milliseconds of CPU in pure Python, then record like ``bench.noop``."""
    global _sync_client
    started = time.time()
    until = time.process_time() + payload["ms"] / 1000
    n = 0
    while time.process_time() < until:
        n += 1
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(os.environ["TASKMESH_BENCH_RECORDER_URL"])
    pipe = _sync_client.pipeline(transaction=False)
    pipe.hincrby(RAN, str(ctx.task_id), 1)
    pipe.hsetnx(START, str(ctx.task_id), repr(started))
    pipe.execute()
