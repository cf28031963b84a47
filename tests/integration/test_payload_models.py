"""A payload that does not fit its handler's declared type is refused at enqueue.

When the enqueuing process has the handler registered, the payload is validated
against the handler's pydantic model or dataclass before anything is written:
422 naming the field under ``payload`` (``tasks[i].payload…`` in a batch, where
only that item is rejected), the same from the Python client. A name without a
handler here is not checked (the instance that runs it decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from taskmesh.clients.client import Client
from taskmesh.errors import InvalidTaskError
from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from tests.conftest import http
from tests.integration.test_api_bad_input import assert_nothing_written, assert_problem, bad_task

pytestmark = pytest.mark.anyio

NOT_INT = "Input should be a valid integer, unable to parse string as an integer"


class Export(BaseModel):
    report_id: str
    rows: int = 0


@dataclass
class Resize:
    width: int


def register(registry: Registry) -> None:
    @registry.task("models.export")
    async def export(payload: Export) -> None:
        return None

    @registry.task("models.resize")
    async def resize(payload: Resize) -> None:
        return None


BAD = [
    bad_task(
        "a required field missing", {"name": "models.export", "payload": {}}, "payload.report_id", "Field required"
    ),
    bad_task(
        "a field of the wrong type",
        {"name": "models.export", "payload": {"report_id": "q4", "rows": "many"}},
        "payload.rows",
        NOT_INT,
    ),
    bad_task(
        "not an object",
        {"name": "models.export", "payload": [1]},
        "payload",
        "Input should be a valid dictionary or instance of Export",
    ),
    bad_task("a dataclass field", {"name": "models.resize", "payload": {"width": "wide"}}, "payload.width", NOT_INT),
]


async def test_a_payload_that_does_not_fit_its_handler_is_refused_naming_the_field_and_nothing_is_written(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    register(registry)
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        for bad in BAD:
            assert_problem(await client.request(bad.method, bad.path, **bad.request), bad)
            await assert_nothing_written(pool, redis_client, keys, bad.case)
        unknown = await client.post("/api/v1/tasks", json={"name": "models.elsewhere", "payload": {}})
        assert unknown.status_code == 201, unknown.text


async def test_a_batch_rejects_only_the_item_whose_payload_does_not_fit(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    register(registry)
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.post(
            "/api/v1/tasks:batch",
            json={"tasks": [{"name": "models.export", "payload": {"report_id": "q4"}}, {"name": "models.export"}]},
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["created"], body["rejected"]) == (1, 1)
    assert body["results"][1] == {
        "index": 1,
        "status": "rejected",
        "errors": [{"field": "tasks[1].payload.report_id", "message": "Field required"}],
    }
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1


async def test_the_client_refuses_a_payload_that_does_not_fit_with_the_same_field(
    database_url: str, redis_url: str, prefix: str, registry: Registry, pool: asyncpg.Pool
) -> None:
    register(registry)
    async with Client(database_url, redis_url, redis_prefix=prefix, registry=registry) as client:
        with pytest.raises(InvalidTaskError) as caught:
            await client.enqueue("models.export", {"rows": 3})
        assert (caught.value.field, caught.value.message) == ("payload.report_id", "Field required")
        with pytest.raises(InvalidTaskError) as caught:
            await client.enqueue_many(
                [{"name": "models.export", "payload": {"report_id": "a"}}, {"name": "models.resize"}]
            )
        assert (caught.value.field, caught.value.message) == (
            "tasks[1].payload.width",
            "Field required",
        )
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0
