"""The Python client enqueues and reads with the API's rules."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg
import pytest
import redis.asyncio as aioredis

import taskmesh
from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from tests.conftest import REDIS_MODE

pytestmark = pytest.mark.anyio


async def test_the_client_enqueues_reads_and_deduplicates(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    async with taskmesh.Client(
        database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=Registry()
    ) as client:
        tid = await client.enqueue("reports.export", {"report": 7}, priority=5, idempotency_key="report-7")
        again = await client.enqueue_detailed("reports.export", {"report": 7}, idempotency_key="report-7")
        delayed = await client.enqueue("reports.export", delay_seconds=30, queue="slow")
        task, run = await client.get(str(tid))
    assert again.task_id == tid and not again.created
    assert task["payload"] == {"report": 7} and task["priority"] == 5 and task["dedup_key"] == "report-7"
    assert run is not None and run["status"] == "queued"
    assert await redis_client.zscore(keys.ready("default"), str(tid)) is not None
    assert await redis_client.zscore(keys.delayed("slow"), str(delayed)) is not None
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 2


async def test_a_client_given_no_prefix_takes_the_environments_as_an_instance_does(
    database_url: str,
    redis_url: str,
    prefix: str,
    pool: asyncpg.Pool,
    redis_client: aioredis.Redis,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TASKMESH_REDIS_PREFIX", prefix)
    async with taskmesh.Client(database_url, redis_url, redis_mode=REDIS_MODE, registry=Registry()) as client:
        tid = await client.enqueue("reports.export", {"report": 8})
    assert await redis_client.zscore(keys.ready("default"), str(tid)) is not None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name"}, "name: String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'"),
        ({"priority": 1001}, "priority: Input should be less than or equal to 1000"),
        ({"max_retries": -1}, "max_retries: Input should be greater than or equal to 0"),
        ({"payload": {"a": "x\x00y"}}, "payload.a: contains a NUL character"),
        ({"payload": {1, 2}}, "payload: is not JSON-serialisable: Type is not JSON serializable: set"),
        ({"run_at": "2026-01-01T00:00:00"}, "run_at: must carry a UTC offset (RFC 3339), e.g. 2026-01-01T12:00:00Z"),
        ({"delay_seconds": 1, "run_at": datetime.now(UTC).isoformat()}, "give delay_seconds or run_at, not both"),
    ],
)
async def test_the_client_refuses_bad_input_like_the_api_and_writes_nothing(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"name": "ok.name", **kwargs}
    name = str(args.pop("name"))
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as client:
        with pytest.raises(taskmesh.InvalidTaskError) as info:
            await client.enqueue(name, **args)  # type: ignore[arg-type]
    assert str(info.value).endswith(message)
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_get_of_an_unknown_task_raises_task_not_found(database_url: str, redis_url: str, prefix: str) -> None:
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as client:
        missing = uuid.uuid4()
        with pytest.raises(taskmesh.TaskNotFoundError) as info:
            await client.get(missing)
    assert (str(info.value), info.value.task_id) == (f"no task has id {missing}", str(missing))
