"""Rate limits: one budget per API key and class of requests, shared by every instance
through Redis, refused with 429 and the IETF RateLimit fields."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
import structlog
from redis import exceptions as redis_errors

from taskmesh.errors import InvalidTaskError
from taskmesh.security import keys as api_keys
from tests.conftest import http, redis_server

pytestmark = pytest.mark.anyio

TIGHT = {"rate_limit_write_per_second": 1.0, "rate_limit_burst_seconds": 5.0, "workers_enabled": False}
"""One write a second, bursts of five: a quick run of requests meets the burst, not the refill."""


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions")


async def test_two_instances_share_one_budget_per_key_and_refuse_past_it_with_429(
    start_instance: Any, stores: Any
) -> None:
    key = (await api_keys.create(stores.pg, "app", ["tasks:read", "tasks:write"])).key
    headers = {"Authorization": f"Bearer {key}"}
    async with start_instance(**TIGHT) as first, start_instance(**TIGHT) as second:
        async with http(first) as one, http(second) as two:
            answers = [
                await (one if i % 2 == 0 else two).post("/api/v1/tasks", json={"name": "x"}, headers=headers)
                for i in range(12)
            ]
            reads = await one.get("/api/v1/tasks", headers=headers)  # another class, another budget
    codes = [r.status_code for r in answers]
    # Five of the burst (a sixth when a second passed meanwhile); two instances do not make it ten.
    assert 5 <= codes.count(201) <= 6 and set(codes) == {201, 429}, codes
    assert codes[:5] == [201] * 5
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.headers["content-type"] == "application/problem+json"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["ratelimit-policy"] == '"write";q=5;w=5'
    assert re.fullmatch(r'"write";r=0;t=\d+', refused.headers["ratelimit"])
    body = refused.json()
    assert (body["title"], body["status"], body["policy"]) == ("Too many requests", 429, "write")
    assert re.fullmatch(
        rf"the key {key[4:20]} made more than 1 write requests per second \(bursts of 5\); retry in \d+\.\d s",
        body["detail"],
    )
    assert reads.status_code == 200


async def test_an_open_instance_and_its_anonymous_callers_are_not_limited(start_instance: Any) -> None:
    async with start_instance(**TIGHT) as inst, http(inst) as client:
        codes = {(await client.post("/api/v1/tasks", json={"name": "x"})).status_code for _ in range(10)}
    assert codes == {201}


async def test_a_key_with_its_own_rate_gets_that_rate_instead_of_the_settings(start_instance: Any, stores: Any) -> None:
    slow = await api_keys.create(stores.pg, "slow", ["tasks:write"], rate_limits={"write": 0.5})
    default = (await api_keys.create(stores.pg, "default", ["tasks:write"])).key
    assert slow.record["rate_limits"] == {"write": 0.5}
    async with start_instance(**{**TIGHT, "rate_limit_write_per_second": 100.0}) as inst, http(inst) as client:

        async def codes(key: str) -> list[int]:
            headers = {"Authorization": f"Bearer {key}"}
            return [
                (await client.post("/api/v1/tasks", json={"name": "x"}, headers=headers)).status_code for _ in range(5)
            ]

        slow_codes, default_codes = await codes(slow.key), await codes(default)
    # 0.5/s with bursts of 5 s: two at once, then refused; the settings' 100/s lets all five through.
    assert (slow_codes[:2], set(slow_codes[2:])) == ([201, 201], {429}), slow_codes
    assert default_codes == [201] * 5


async def test_a_key_rate_of_an_unknown_class_or_out_of_range_is_refused(stores: Any) -> None:
    for rates, field, message in (
        ({"writes": 5}, "rate_limits.writes", "unknown class; known: read, write, admin"),
        ({"read": 0}, "rate_limits.read", "must be a number of requests per second, 0 < r <= 1000000"),
        ({"read": float("inf")}, "rate_limits.read", "must be a number of requests per second, 0 < r <= 1000000"),
    ):
        with pytest.raises(InvalidTaskError) as caught:
            await api_keys.create(stores.pg, "x", ["tasks:read"], rate_limits=rates)
        assert (caught.value.field, caught.value.message) == (field, message)


async def test_a_key_rate_over_the_api_must_be_a_number(start_instance: Any, stores: Any) -> None:
    admin = (await api_keys.create(stores.pg, "admin", list(api_keys.SCOPES))).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        answers = [
            await client.post(
                "/api/v1/keys",
                json={"name": "x", "role": "viewer", "rate_limits": {"read": value}},
                headers={"Authorization": f"Bearer {admin}"},
            )
            for value in ("5", True)
        ]
    assert [(a.status_code, a.json()["errors"][0]["field"]) for a in answers] == [
        (422, "rate_limits.read"),
        (422, "rate_limits.read"),
    ]


async def test_while_redis_is_down_keyed_requests_go_through_and_one_line_stands_for_the_unchecked_ones(
    start_instance: Any, stores: Any
) -> None:
    made = await api_keys.create(stores.pg, "app", ["tasks:read"])
    headers = {"Authorization": f"Bearer {made.key}"}
    with redis_server() as port:
        url = f"redis://127.0.0.1:{port}/0"
        settings = {"redis_url": url, "redis_mode": "standalone", "workers_enabled": False}
        async with start_instance(**settings) as inst, http(inst) as client:
            before = await client.get("/api/v1/tasks", headers=headers)
            down = aioredis.from_url(url)
            with contextlib.suppress(redis_errors.ConnectionError):
                await down.shutdown(nosave=True)
            await down.aclose()
            with structlog.testing.capture_logs() as logs:
                codes = [(await client.get("/api/v1/tasks", headers=headers)).status_code for _ in range(20)]
    assert before.status_code == 200
    assert codes == [200] * 20  # the limit protects the platform: an outage does not refuse everyone
    lines = [line for line in logs if line["event"] == "rate_limit_unchecked"]
    assert [line["count"] for line in lines] == [1], "one line per interval, not one per request"
    assert lines[0]["bucket"] == f"read:{made.record['key_id']}"
