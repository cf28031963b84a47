"""The limits' Redis scripts on a real Redis: admission, parking and the fenced release of a slot."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from taskmesh.limits.book import LimitBook
from taskmesh.limits.settings import LimitSettings
from taskmesh.store import RedisStore
from taskmesh.store.keys import Keys
from taskmesh.store.redis_limits import Release
from taskmesh.tasks.tasks import Tasks

pytestmark = pytest.mark.anyio

QUEUE = "default"
LEASE_MS = 30_000


def book() -> LimitBook:
    return LimitBook({"api": LimitSettings(concurrency=1)})


async def limited(redis: RedisStore, client: aioredis.Redis, keys: Keys, n: int) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(n)]
    await client.hset(keys.limit_tasks(QUEUE), mapping=dict.fromkeys(ids, "api"))
    await client.set(keys.marker(QUEUE), "test")
    return ids


async def test_a_full_key_parks_the_rest_and_a_release_moves_one_back_to_ready(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys
) -> None:
    redis = tasks.redis
    a, b, c = await limited(redis, redis_client, keys, 3)
    admitted = await redis.limits.admit(QUEUE, [(a, 1.0), (b, 2.0), (c, 3.0)], book().script_args(), LEASE_MS)
    assert admitted.started == [(a, ["api"])] and admitted.parked == [(b, "api"), (c, "api")]
    await redis.limits.release(QUEUE, [Release(a, ["api"], fence=admitted.until_ms)], book().script_args())
    assert await redis_client.zrange(keys.ready(QUEUE), 0, -1) == [b]  # one back: the key's room
    assert await redis_client.zrange(keys.limit_base(QUEUE) + "parked:api", 0, -1) == [c]


async def test_a_release_fenced_by_an_older_lease_end_leaves_a_newer_runs_slot(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys
) -> None:
    redis = tasks.redis
    [a] = await limited(redis, redis_client, keys, 1)
    first = await redis.limits.admit(QUEUE, [(a, 1.0)], book().script_args(), LEASE_MS)
    # the run's lease was lost and its slot given back; the task started again, here under the same id
    await redis.limits.release(QUEUE, [Release(a, ["api"])], book().script_args())
    await redis_client.hset(keys.limit_tasks(QUEUE), a, "api")
    again = await redis.limits.admit(QUEUE, [(a, 1.0)], book().script_args(), LEASE_MS + 5_000)
    assert again.started == [(a, ["api"])]
    # the first run's result comes late: its release, fenced by its own lease end, takes nothing
    await redis.limits.release(QUEUE, [Release(a, ["api"], fence=first.until_ms)], book().script_args())
    assert await redis_client.zscore(keys.limit_base(QUEUE) + "slots:api", a) == again.until_ms
    await redis.limits.release(QUEUE, [Release(a, ["api"], fence=again.until_ms)], book().script_args())
    assert await redis_client.zcard(keys.limit_base(QUEUE) + "slots:api") == 0


async def test_without_the_queues_marker_no_limited_id_starts(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys
) -> None:
    redis = tasks.redis
    [a] = await limited(redis, redis_client, keys, 1)
    await redis_client.delete(keys.marker(QUEUE))  # Redis lost the queue's keys: its slots too
    admitted = await redis.limits.admit(QUEUE, [(a, 1.0)], book().script_args(), LEASE_MS)
    assert admitted.started == [] and admitted.parked == [(a, "api")]
