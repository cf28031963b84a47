"""Payload integers beyond 64 bits: refused naming their path, never rounded to floats.

orjson, which parses request bodies and writes payloads, reads an integer
literal outside -2^63 .. 2^64-1 as a float, silently rounded; it cannot write
one at all. The API and the Python client refuse such an integer with a 422
(``InvalidTaskError``) naming the field path, and write nothing; integers at
the edges of the range and genuine floats such as ``1e300`` are stored as
sent.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from taskmesh.clients.client import Client
from taskmesh.errors import InvalidTaskError
from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from tests.conftest import REDIS_MODE, http
from tests.integration.test_api_bad_input import assert_nothing_written, assert_problem, raw_task

pytestmark = pytest.mark.anyio

BIG = "integer beyond 64 bits (-2^63 .. 2^64-1); send it as a string"
TASKS = "/api/v1/tasks"


@dataclass
class Ref:
    id: int


REFUSED = [
    raw_task(
        "2^64 in a nested object",
        b'{"name":"x","payload":{"customer":{"id":18446744073709551616}}}',
        "payload.customer.id",
        BIG,
    ),
    raw_task(
        "-2^63 - 1 in an array",
        b'{"name":"x","payload":{"ids":[1,-9223372036854775809]}}',
        "payload.ids[1]",
        BIG,
    ),
    raw_task("a 40-digit payload", b'{"name":"x","payload":1234567890123456789012345678901234567890}', "payload", BIG),
    raw_task(
        "beside a genuine big float",
        b'{"name":"x","payload":{"f":1e300,"n":100000000000000000000}}',
        "payload.n",
        BIG,
    ),
]


@pytest.fixture
async def client(start_instance: Any) -> Any:
    async with start_instance(workers_enabled=False) as inst, http(inst) as c:
        yield c


async def test_an_integer_beyond_64_bits_in_a_payload_is_refused_naming_its_path_and_nothing_is_written(
    client: httpx.AsyncClient, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    for bad in REFUSED:
        r = await client.request(bad.method, bad.path, **bad.request)
        assert_problem(r, bad)
        await assert_nothing_written(pool, redis_client, keys, bad.case)


async def test_a_batch_rejects_the_item_with_a_big_integer_and_stores_the_others(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    body = b'{"tasks":[{"name":"x","payload":{"n":1}},{"name":"x","payload":{"a":{"b":[18446744073709551616]}}}]}'
    r = await client.post(f"{TASKS}:batch", content=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["created"], answer["rejected"]) == (1, 1)
    assert answer["results"][1] == {
        "index": 1,
        "status": "rejected",
        "errors": [{"field": "tasks[1].payload.a.b[0]", "message": BIG}],
    }
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1


async def test_integers_at_the_edges_of_64_bits_and_genuine_floats_are_stored_exactly(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    body = (
        b'{"name":"x","payload":{"min":-9223372036854775808,"max":18446744073709551615,'
        b'"f":1e300,"g":-1.5e+20,"h":9007199254740993.0,"s":"123456789012345678901234567890"}}'
    )
    r = await client.post(TASKS, content=body)
    assert r.status_code == 201, r.text
    got = (await client.get(f"{TASKS}/{r.json()['task_id']}")).json()["task"]["payload"]
    assert got == {
        "min": -(2**63),
        "max": 2**64 - 1,
        "f": 1e300,
        "g": -1.5e20,
        "h": 9007199254740992.0,
        "s": "123456789012345678901234567890",
    }
    assert isinstance(got["f"], float) and isinstance(got["max"], int)
    stored = await pool.fetchval("SELECT payload->>'max' FROM tasks WHERE id = $1", uuid.UUID(r.json()["task_id"]))
    assert stored == "18446744073709551615"


async def test_the_client_refuses_an_integer_beyond_64_bits_with_the_same_message_and_path(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    cases: list[tuple[Any, str]] = [
        ({"customer": {"id": 2**64}}, "payload.customer.id"),
        ({"ids": [1, -(2**63) - 1]}, "payload.ids[1]"),
        ({"pair": (0, 2**70)}, "payload.pair[1]"),
        (10**30, "payload"),
        (Ref(2**64), "payload"),  # orjson writes dataclasses itself: its error is translated
    ]
    async with Client(
        database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=Registry()
    ) as client:
        for payload, path in cases:
            with pytest.raises(InvalidTaskError) as caught:
                await client.enqueue("x", payload)
            assert (caught.value.field, caught.value.message) == (path, BIG), payload
        with pytest.raises(InvalidTaskError) as caught:
            await client.enqueue_many([{"name": "x"}, {"name": "x", "payload": {"n": 2**64}}])
        assert (caught.value.field, caught.value.message) == ("tasks[1].payload.n", BIG)
        await assert_nothing_written(pool, redis_client, keys, "client")
        ok = await client.enqueue("x", {"max": 2**64 - 1, "min": -(2**63), "f": 1e300})
        task, _ = await client.get(ok)
    assert task["payload"] == {"max": 2**64 - 1, "min": -(2**63), "f": 1e300}
