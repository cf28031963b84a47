"""Redis access: the client, pushes into the per-queue structures, the Lua scripts.

Redis holds only task ids (design.md principle 1); every function here can be
repeated safely: pushes use ``ZADD NX``, the DLQ mirror removes before it adds.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any

import redis.asyncio as aioredis

from taskmesh.models import PushTarget
from taskmesh.store.keys import EPOCH_MS, PRIORITY_STEP, Keys, ready_score

Redis = aioredis.Redis


@cache
def lua(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files("taskmesh.store").joinpath("lua", f"{name}.lua").read_text()


def create_client(redis_url: str) -> Redis:
    """A redis-py asyncio client with short connect and read timeouts (seconds).

    Reads are allowed 5 s beyond a blocking pop's own timeout.
    """
    return aioredis.Redis.from_url(
        redis_url,
        socket_connect_timeout=2,
        socket_timeout=10,
        health_check_interval=15,
        decode_responses=True,
    )


def now_ms() -> int:
    """Wall-clock time in milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


async def push(client: Redis, keys: Keys, targets: Iterable[PushTarget]) -> int:
    """Push queued tasks into their ready or delayed set in one pipeline.

    One ``ZADD NX`` (and, for delayed tasks, one ``HSET``) per queue and set
    with every member of the batch, not one command per task: a bulk enqueue
    of 1,000 tasks is a handful of commands (building and parsing one command
    per id cost more than the whole PostgreSQL insert).

    :param targets: tasks with ``due_at=None`` (ready now) or a due time (delayed).
    :returns: how many ids were pushed (repeats are harmless: ``ZADD NX``).
    :raises redis.RedisError: Redis did not answer; Postgres still has the tasks
        and the re-push service retries.
    """
    ready: dict[str, dict[str, float]] = {}
    delayed: dict[str, dict[str, float]] = {}
    priorities: dict[str, dict[str, int]] = {}
    n = 0
    now = now_ms()
    for t in targets:
        tid = str(t.task_id)
        if t.due_at is None:
            ready.setdefault(t.queue, {})[tid] = ready_score(t.priority, now)
        else:
            priorities.setdefault(t.queue, {})[tid] = t.priority
            delayed.setdefault(t.queue, {})[tid] = _ms(t.due_at)
        n += 1
    if not n:
        return 0
    async with client.pipeline(transaction=False) as pipe:
        for queue, members in ready.items():
            pipe.zadd(keys.ready(queue), members, nx=True)
        for queue, fields in priorities.items():
            pipe.hset(keys.priorities(queue), mapping=fields)  # type: ignore[arg-type]
            pipe.zadd(keys.delayed(queue), delayed[queue], nx=True)
        await pipe.execute()
    return n


async def push_ready_or_delayed(client: Redis, keys: Keys, targets: Iterable[PushTarget]) -> int:
    """Like :func:`push`, but a target whose due time has passed goes to ready."""
    cutoff = time.time()
    fixed = [
        PushTarget(t.task_id, t.queue, t.priority, None)
        if t.due_at is not None and t.due_at.timestamp() <= cutoff
        else t
        for t in targets
    ]
    return await push(client, keys, fixed)


async def push_missing(client: Redis, keys: Keys, targets: Sequence[PushTarget]) -> list[PushTarget]:
    """Push only the targets whose id is in neither the ready nor the delayed set.

    Two pipelined round trips: membership first (one ``ZMSCORE`` per queue and
    set, not one command per id: a resync checks whole backlogs), then the
    pushes (still ``ZADD NX``, so a race with a concurrent push is harmless).
    :returns: the targets pushed, i.e. repaired.
    """
    if not targets:
        return []
    by_queue: dict[str, list[PushTarget]] = {}
    for t in targets:
        by_queue.setdefault(t.queue, []).append(t)
    async with client.pipeline(transaction=False) as pipe:
        for queue, group in by_queue.items():
            ids = [str(t.task_id) for t in group]
            pipe.zmscore(keys.ready(queue), ids)
            pipe.zmscore(keys.delayed(queue), ids)
        scores = await pipe.execute()
    missing: list[PushTarget] = []
    for i, group in enumerate(by_queue.values()):
        in_ready, in_delayed = scores[2 * i], scores[2 * i + 1]
        missing.extend(t for t, r, d in zip(group, in_ready, in_delayed, strict=True) if r is None and d is None)
    await push_ready_or_delayed(client, keys, missing)
    return missing


async def dead_letter(client: Redis, keys: Keys, queue: str, task_ids: list[str]) -> None:
    """Mirror dead-lettered tasks into the queue's DLQ list (newest last)."""
    if not task_ids:
        return
    async with client.pipeline(transaction=False) as pipe:
        for tid in task_ids:
            pipe.lrem(keys.dlq(queue), 0, tid)
            pipe.rpush(keys.dlq(queue), tid)
        await pipe.execute()


async def replay(client: Redis, keys: Keys, queue: str, items: list[tuple[str, int]]) -> None:
    """Take replayed tasks out of the DLQ mirror and push them ready.

    :param items: ``(task_id, priority)`` pairs.
    """
    if not items:
        return
    async with client.pipeline(transaction=False) as pipe:
        for tid, priority in items:
            pipe.lrem(keys.dlq(queue), 0, tid)
            pipe.zadd(keys.ready(queue), {tid: ready_score(priority, now_ms())}, nx=True)
        await pipe.execute()


async def pop_ready(client: Redis, keys: Keys, queue: str, count: int, block_seconds: float) -> list[str]:
    """Pop up to ``count`` ids from a queue's ready set, best score first.

    Blocks up to ``block_seconds`` when the set is empty (``BZMPOP``; the wait is
    server-side, so it is an argument rather than a client timeout).
    :returns: the popped ids (empty after a timeout).
    """
    reply: Any = await client.bzmpop(block_seconds, 1, [keys.ready(queue)], min=True, count=count)
    if not reply:
        return []
    _key, members = reply
    return [m[0] if isinstance(m, list | tuple) else m for m in members]


async def move_due(client: Redis, keys: Keys, queue: str, limit: int = 1000) -> int:
    """Run ``delayed_move.lua`` once for ``queue``: due ids go to ready.

    :returns: ids moved.
    """
    moved = await client.eval(
        lua("delayed_move"),
        3,
        keys.delayed(queue),
        keys.ready(queue),
        keys.priorities(queue),
        now_ms(),
        limit,
        EPOCH_MS,
        PRIORITY_STEP,
    )
    return int(moved)


async def try_lock(client: Redis, key: str, ttl_ms: int) -> str | None:
    """Take a short singleton lock (``SET key token NX PX ttl``).

    :returns: the holder token, or ``None`` when another holder has it. The lock
        only saves work (design.md principle 5); it never guards correctness.
    """
    token = secrets.token_hex(8)
    ok = await client.set(key, token, nx=True, px=ttl_ms)
    return token if ok else None


async def release_lock(client: Redis, key: str, token: str) -> bool:
    """Release a lock taken by :func:`try_lock` if it is still ours."""
    released = await client.eval(lua("lock_release"), 1, key, token)
    return bool(released)


async def forget(client: Redis, keys: Keys, queue: str, task_id: str) -> None:
    """Remove a task id from every structure of its queue (a cancelled task)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.ready(queue), task_id)
        pipe.zrem(keys.delayed(queue), task_id)
        pipe.hdel(keys.priorities(queue), task_id)
        pipe.lrem(keys.dlq(queue), 0, task_id)
        await pipe.execute()


async def rewrite_dlq(client: Redis, keys: Keys, queue: str, task_ids: list[str]) -> bool:
    """Make the DLQ mirror of ``queue`` hold exactly ``task_ids`` (oldest first).

    :returns: whether it had to change (the list differed).
    """
    current = await client.lrange(keys.dlq(queue), 0, -1)
    if current == task_ids:
        return False
    async with client.pipeline(transaction=True) as pipe:
        pipe.delete(keys.dlq(queue))
        if task_ids:
            pipe.rpush(keys.dlq(queue), *task_ids)
        await pipe.execute()
    return True


async def identity(client: Redis, keys: Keys) -> tuple[str, bool]:
    """``(run_id, marker_present)``: a new run_id means a restart, a missing marker a flush."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.info("server")
        pipe.exists(keys.marker())
        info, marker = await pipe.execute()
    return str(info.get("run_id", "")), bool(marker)


async def set_marker(client: Redis, keys: Keys, value: str) -> None:
    """Write the marker whose disappearance tells the reconciler Redis lost its data."""
    await client.set(keys.marker(), value)


async def depths(client: Redis, keys: Keys, queue: str) -> tuple[int, int, int]:
    """``(ready, delayed, dlq)`` lengths of one queue."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.zcard(keys.ready(queue))
        pipe.zcard(keys.delayed(queue))
        pipe.llen(keys.dlq(queue))
        ready, delayed, dlq = await pipe.execute()
    return int(ready), int(delayed), int(dlq)
