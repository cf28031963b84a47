"""Tenants' quotas: most open tasks, most payload bytes, tasks per second; each refusal
names its quota and tenant, stores nothing, and leaves other tenants alone."""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from taskmesh.clients.client import Client
from taskmesh.config import TenantQuota
from taskmesh.errors import QuotaExceededError
from taskmesh.security import keys as api_keys
from taskmesh.store.keys import Keys
from taskmesh.tasks.queued_quota import QueuedLimits
from tests.conftest import REDIS_MODE, http

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions")


async def test_max_queued_refuses_creates_beyond_it_and_frees_as_tasks_finish(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    quotas = {"acme": TenantQuota(max_queued=3)}
    async with start_instance(workers_enabled=False, tenant_quotas=quotas) as inst, http(inst) as client:
        made = [await client.post("/api/v1/tasks", json={"name": "x", "tenant_id": "acme"}) for _ in range(3)]
        over = await client.post("/api/v1/tasks", json={"name": "x", "tenant_id": "acme"})
        batch = await client.post(
            "/api/v1/tasks:batch", json={"tasks": [{"name": "x", "tenant_id": "acme"}, {"name": "x"}]}
        )
        other = await client.post("/api/v1/tasks", json={"name": "x", "tenant_id": "globex"})
        await pool.execute("UPDATE tasks SET status = 'completed' WHERE id = $1::uuid", made[0].json()["task_id"])
        freed = await client.post("/api/v1/tasks", json={"name": "x", "tenant_id": "acme"})
    assert [m.status_code for m in made] == [201] * 3
    assert over.status_code == 429 and over.headers["content-type"] == "application/problem+json"
    assert over.json() == {
        "type": "about:blank",
        "title": "Quota exceeded",
        "status": 429,
        "detail": "tenant 'acme' has 3 tasks queued or running and its max_queued quota is 3: 1 more would exceed it",
        "quota": "max_queued",
        "tenant_id": "acme",
    }
    assert (batch.status_code, batch.json()["quota"]) == (429, "max_queued")
    assert other.status_code == 201 and freed.status_code == 201
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE tenant_id = 'acme'") == 4  # nothing half-stored
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE tenant_id IS NULL") == 0


async def test_max_payload_bytes_answers_413_naming_the_field(start_instance: Any, pool: asyncpg.Pool) -> None:
    async with (
        start_instance(workers_enabled=False, tenant_quota_default=TenantQuota(max_payload_bytes=100)) as inst,
        http(inst) as client,
    ):
        small = await client.post("/api/v1/tasks", json={"name": "x", "tenant_id": "any", "payload": {"a": 1}})
        big = await client.post("/api/v1/tasks", json={"name": "x", "tenant_id": "any", "payload": {"a": "b" * 200}})
        in_batch = await client.post(
            "/api/v1/tasks:batch",
            json={"tasks": [{"name": "x", "tenant_id": "any"}, {"name": "x", "tenant_id": "any", "payload": "c" * 99}]},
        )
        untenanted = await client.post("/api/v1/tasks", json={"name": "x", "payload": {"a": "b" * 200}})
    assert small.status_code == 201 and untenanted.status_code == 201
    assert (big.status_code, big.json()["detail"], big.json()["quota"]) == (
        413,
        "payload: 208 bytes as JSON; tenant 'any' has a max_payload_bytes quota of 100",
        "max_payload_bytes",
    )
    assert (in_batch.status_code, in_batch.json()["detail"]) == (
        413,
        "tasks[1].payload: 101 bytes as JSON; tenant 'any' has a max_payload_bytes quota of 100",
    )
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE tenant_id = 'any'") == 1


async def test_enqueue_per_second_is_shared_by_instances_and_counts_tasks_not_requests(start_instance: Any) -> None:
    # A slow refill (one task per 5 s), so that a loaded machine's slow requests cannot refill the bucket.
    quotas = {"acme": TenantQuota(enqueue_per_second=0.2)}
    settings = {"workers_enabled": False, "tenant_quotas": quotas, "rate_limit_burst_seconds": 20.0}
    async with start_instance(**settings) as first, start_instance(**settings) as second:
        async with http(first) as one, http(second) as two:
            batch = await one.post("/api/v1/tasks:batch", json={"tasks": [{"name": "x", "tenant_id": "acme"}] * 3})
            single = await two.post("/api/v1/tasks", json={"name": "x", "tenant_id": "acme"})
            over = await one.post("/api/v1/tasks", json={"name": "x", "tenant_id": "acme"})
            too_big = await two.post("/api/v1/tasks:batch", json={"tasks": [{"name": "x", "tenant_id": "acme"}] * 5})
    assert (batch.json()["created"], single.status_code) == (3, 201)
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
    assert over.json()["quota"] == "enqueue_per_second"
    assert re.fullmatch(
        r"tenant 'acme' may create 0.2 tasks per second \(bursts of 4\) and is over it; retry in \d+\.\d s",
        over.json()["detail"],
    )
    assert (too_big.status_code, too_big.json()["detail"]) == (
        429,
        "5 tasks at once are more than tenant 'acme' may ever create at once (4, from its enqueue_per_second "
        "quota of 0.2): send smaller batches",
    )


async def test_a_tenants_request_budget_holds_however_many_keys_it_has(start_instance: Any, stores: Any) -> None:
    keys = [(await api_keys.create(stores.pg, f"acme-{i}", ["tasks:read"], tenant_id="acme")).key for i in range(3)]
    other = (await api_keys.create(stores.pg, "globex", ["tasks:read"], tenant_id="globex")).key
    quotas = {"acme": TenantQuota(read_per_second=1.0)}
    settings = {"workers_enabled": False, "tenant_quotas": quotas, "rate_limit_burst_seconds": 3.0}
    async with start_instance(**settings) as inst, http(inst) as client:
        codes = [
            (await client.get("/api/v1/tasks", headers={"Authorization": f"Bearer {keys[i % 3]}"})).status_code
            for i in range(6)
        ]
        refused = await client.get("/api/v1/tasks", headers={"Authorization": f"Bearer {keys[0]}"})
        theirs = await client.get("/api/v1/tasks", headers={"Authorization": f"Bearer {other}"})
    # Bursts of three for the whole tenant, not three per key.
    assert codes[:3] == [200] * 3 and 429 in codes[3:], codes
    assert refused.status_code == 429 and refused.headers["ratelimit-policy"] == '"read";q=3;w=3'
    assert re.fullmatch(
        r"tenant 'acme' made more than 1 read requests per second \(bursts of 3\); retry in \d+\.\d s",
        refused.json()["detail"],
    )
    assert theirs.status_code == 200


def refused_max_queued(tenant: str, held: int, most: int, more: int) -> dict[str, Any]:
    """The exact problem of a create ``max_queued`` refuses."""
    return {
        "type": "about:blank",
        "title": "Quota exceeded",
        "status": 429,
        "detail": f"tenant {tenant!r} has {held} tasks queued or running and its max_queued quota is {most}: "
        f"{more} more would exceed it",
        "quota": "max_queued",
        "tenant_id": tenant,
    }


async def concurrently(calls: list[Callable[[], Awaitable[httpx.Response]]]) -> list[httpx.Response]:
    """Every call started at once (the creates race for the last places); their answers in order."""
    answers: list[httpx.Response | None] = [None] * len(calls)

    async def one(i: int) -> None:
        answers[i] = await calls[i]()

    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            tg.start_soon(one, i)
    return [a for a in answers if a is not None]


async def test_max_queued_is_exact_under_concurrent_creates_on_two_instances(
    start_instance: Any, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    settings = {"workers_enabled": False, "tenant_quotas": {"acme": TenantQuota(max_queued=20)}}
    async with start_instance(**settings) as first, start_instance(**settings) as second:
        async with http(first) as one, http(second) as two:
            body = {"name": "x", "tenant_id": "acme"}
            answers = await concurrently(
                [functools.partial((one, two)[i % 2].post, "/api/v1/tasks", json=body) for i in range(60)]
            )
    codes = Counter(a.status_code for a in answers)
    assert codes == {201: 20, 429: 40}, codes
    for refused in (a for a in answers if a.status_code == 429):
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json() == refused_max_queued("acme", 20, 20, 1)
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE tenant_id = 'acme'") == 20
    assert await redis_client.zcard(keys.ready("default")) == 20


async def test_max_queued_is_exact_for_copied_and_inserted_batches_on_two_instances(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    settings = {"workers_enabled": False, "tenant_quotas": {"acme": TenantQuota(max_queued=200)}}
    async with start_instance(**settings) as first, start_instance(**settings) as second:
        async with http(first) as one, http(second) as two:
            # 64 immediate tasks without dedup keys are copied (COPY): room for three batches of eight.
            copied = {"tasks": [{"name": "x", "tenant_id": "acme"}] * 64}
            big = await concurrently(
                [functools.partial((one, two)[i % 2].post, "/api/v1/tasks:batch", json=copied) for i in range(8)]
            )
            # Batches with dedup keys are inserted (INSERT): the 8 places left take two of these.
            small = await concurrently(
                [
                    functools.partial(
                        (one, two)[i % 2].post,
                        "/api/v1/tasks:batch",
                        json={"tasks": [{"name": "x", "tenant_id": "acme", "dedup_key": f"{i}-{k}"} for k in range(4)]},
                    )
                    for i in range(8)
                ]
            )
    assert Counter(a.status_code for a in big) == {200: 3, 429: 5}
    assert [a.json() for a in big if a.status_code == 429] == [refused_max_queued("acme", 192, 200, 64)] * 5
    assert Counter(a.status_code for a in small) == {200: 2, 429: 6}
    assert [a.json() for a in small if a.status_code == 429] == [refused_max_queued("acme", 200, 200, 4)] * 6
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE tenant_id = 'acme'") == 200


async def test_max_queued_is_exact_for_transactional_creates_of_two_clients(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    limits = QueuedLimits({"acme": 5})
    options: dict[str, Any] = {"redis_prefix": prefix, "redis_mode": REDIS_MODE, "queued_limits": limits}
    outcomes: list[str] = []
    async with Client(database_url, redis_url, **options) as first, Client(database_url, redis_url, **options) as two:

        async def create(client: Client) -> None:
            app = await asyncpg.connect(database_url)
            try:
                async with app.transaction():
                    await client.enqueue("x", tenant_id="acme", connection=app)
                outcomes.append("stored")
            except QuotaExceededError as exc:
                assert str(exc) == refused_max_queued("acme", 5, 5, 1)["detail"]
                outcomes.append("refused")
            finally:
                await app.close()

        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(create, (first, two)[i % 2])
        # The client's own creates (one INSERT, or COPY for 64 or more) hold the same count.
        with pytest.raises(QuotaExceededError):
            await first.enqueue("x", tenant_id="acme")
        with pytest.raises(QuotaExceededError):
            await two.enqueue_many([{"name": "x", "tenant_id": "acme"}] * 64)
        untenanted = await first.enqueue_many([{"name": "x"}] * 64)
    assert Counter(outcomes) == {"stored": 5, "refused": 11}
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE tenant_id = 'acme'") == 5
    assert len(untenanted) == 64
