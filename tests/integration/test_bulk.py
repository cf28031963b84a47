"""Bulk enqueue: one statement, one pipeline, each item's outcome reported."""

from __future__ import annotations

import copy
import json
from types import MappingProxyType
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

import taskmesh
from taskmesh.errors import StoreError
from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from tests.conftest import REDIS_MODE, http, wait_for

pytestmark = pytest.mark.anyio


async def test_a_batch_stores_the_valid_items_and_reports_each_outcome(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    @registry.task("bulk.job")
    async def job(payload: Any) -> None:
        return None

    async with start_instance() as inst, http(inst) as client:
        first = await client.post("/api/v1/tasks", json={"name": "bulk.job", "dedup_key": "already"})
        existing = first.json()["task_id"]
        body = {
            "tasks": [
                {"name": "bulk.job", "payload": {"n": 1}},
                {"name": "bad name"},
                {"name": "bulk.job", "dedup_key": "already"},
                {"name": "bulk.job", "dedup_key": "twice"},
                {"name": "bulk.job", "dedup_key": "twice"},
                {"name": "bulk.job", "priority": 2000},
                {"name": "bulk.job", "delay_seconds": 3600},
            ]
        }
        r = await client.post("/api/v1/tasks:batch", json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert (answer["created"], answer["deduplicated"], answer["rejected"]) == (3, 2, 2)
        statuses = [item["status"] for item in answer["results"]]
        assert statuses == ["created", "rejected", "deduplicated", "created", "deduplicated", "rejected", "created"]
        results = answer["results"]
        assert results[2]["task_id"] == existing
        assert results[4]["task_id"] == results[3]["task_id"]
        assert results[1]["errors"] == [
            {"field": "tasks[1].name", "message": "String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'"}
        ]
        assert results[5]["errors"] == [
            {"field": "tasks[5].priority", "message": "Input should be less than or equal to 1000"}
        ]
        assert await pool.fetchval("SELECT count(*) FROM tasks") == 4
        delayed_id = results[6]["task_id"]
        assert await redis_client.zscore(keys.delayed("default"), delayed_id) is not None
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 3 FROM tasks WHERE status = 'completed'"))
        # A run row per attempt, written at the claim: the delayed task has none yet.
        assert await pool.fetchval("SELECT count(*) FROM task_runs") == 3


async def test_an_atomic_batch_with_one_bad_item_stores_nothing(start_instance: Any, pool: asyncpg.Pool) -> None:
    async with start_instance() as inst, http(inst) as client:
        body = {"atomic": True, "tasks": [{"name": "ok"}, {"name": "ok", "max_retries": -1}]}
        r = await client.post("/api/v1/tasks:batch", json=body)
        assert r.status_code == 422
        problem = r.json()
        assert problem["detail"] == (
            "tasks[1].max_retries: Input should be greater than or equal to 0 (atomic batch: nothing stored)"
        )
        assert [x["status"] for x in problem["results"]] == ["not stored", "rejected"]
        for bad, message in (
            ({"tasks": []}, "tasks: must be a list of 1 to 1000 tasks"),
            ({"tasks": [{"name": "x"}] * 1001}, "tasks: must be a list of 1 to 1000 tasks"),
            ({"tasks": [{"name": "x"}], "atomic": "yes"}, "atomic: must be true or false"),
            ({"tasks": [{"name": "x"}], "extra": 1}, "extra: unknown field"),
            ([{"name": "x"}], "body: must be a JSON object"),
        ):
            r = await client.post("/api/v1/tasks:batch", json=bad)
            assert (r.status_code, r.json()["detail"]) == (422, message)
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_enqueue_many_writes_a_thousand_tasks_in_one_call(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    async with taskmesh.Client(
        database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=Registry()
    ) as client:
        out = await client.enqueue_many([{"name": "n", "payload": {"i": i}, "priority": i % 7} for i in range(1000)])
        again = await client.enqueue_many([{"name": "n", "dedup_key": "k"}, {"name": "n", "dedup_key": "k"}])
        with pytest.raises(taskmesh.InvalidTaskError) as info:
            await client.enqueue_many([{"name": "n"}, {"name": "n", "payload": {"x": "\x00"}}])
    assert all(o.created for o in out) and len({o.task_id for o in out}) == 1000
    assert [o.created for o in again] == [True, False] and again[0].task_id == again[1].task_id
    assert str(info.value) == "tasks[1].payload.x: contains a NUL character"
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1001
    assert await redis_client.zcard(keys.ready("default")) == 1001


async def test_a_copied_bulk_enqueue_stores_what_an_inserted_one_does(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    """300 immediate tasks without a dedup key go by COPY; with one dedup key the batch is INSERTed."""
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as client:
        copied = await client.enqueue_many(
            [{"name": "c", "payload": {"i": i}, "priority": i % 3, "queue_name": "copied"} for i in range(300)]
        )
        inserted = await client.enqueue_many(
            [{"name": "c", "payload": {"i": i}, "queue_name": "inserted"} for i in range(299)]
            + [{"name": "c", "dedup_key": "one", "queue_name": "inserted"}]
        )
    rows = await pool.fetch(
        "SELECT queue, count(*) AS n, count(DISTINCT trace_id) AS traces, bool_and(run_at = created_at) AS now_due,"
        " bool_and(status = 'queued' AND type = 'immediate' AND attempts = 0 AND max_retries = 3) AS fresh,"
        " count(DISTINCT created_at) AS instants FROM tasks GROUP BY queue ORDER BY queue"
    )
    assert [dict(r) for r in rows] == [
        {"queue": q, "n": 300, "traces": 300, "now_due": True, "fresh": True, "instants": 1}
        for q in ("copied", "inserted")
    ]
    assert all(o.created and o.queue == "copied" and len(o.trace_id or "") == 32 for o in copied)
    assert await pool.fetchval("SELECT payload FROM tasks WHERE id = $1", copied[7].task_id) == '{"i": 7}'
    assert await redis_client.zcard(keys.ready("copied")) == 300
    assert await redis_client.zcard(keys.ready("inserted")) == 300
    first = await redis_client.zrange(keys.ready("copied"), 0, 0)
    assert first == [str(copied[2].task_id)]  # priority 2 pops first
    assert len({o.task_id for o in copied + inserted}) == 600


AWKWARD = ["tab\there", "line\nbreak", "cr\rhere", "back\\slash", "\\N", "\\.", "é ü 字 🙂", 'quote"s', "\\t literal"]


async def test_a_copied_batch_stores_every_character_of_its_texts_and_payloads_as_given(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, redis_client: aioredis.Redis
) -> None:
    """COPY's text format escapes backslash, tab and line breaks; each field comes back as it was sent.

    ``redis_client`` deletes the prefix's keys after (the pushed ids), as every test's are.
    """
    tasks = [
        {
            "name": "c",
            "payload": {"text": text, "nested": [text, {"k\\ey": text}], "n": i},
            # A tenant id holds printable characters only (as a key's): its backslashes are still escaped.
            "tenant_id": text if text.isprintable() else repr(text),
            "trace_id": f"{text}-{i}",
        }
        for i, text in enumerate(AWKWARD * 8)
    ]
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as client:
        made = await client.enqueue_many(tasks)
    rows = {r["id"]: r for r in await pool.fetch("SELECT id, payload::text AS payload, tenant_id, trace_id FROM tasks")}
    assert len(rows) == len(tasks) == 72  # above COPY_MIN_TASKS: copied
    for task, out in zip(tasks, made, strict=True):
        row = rows[out.task_id]
        assert (row["tenant_id"], row["trace_id"]) == (task["tenant_id"], task["trace_id"])
        assert json.loads(row["payload"]) == task["payload"]
        assert out.trace_id == task["trace_id"]


async def test_a_row_postgresql_refuses_late_in_a_copied_batch_writes_nothing_and_the_client_goes_on(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    """PostgreSQL fails the third of four COPY statements: the batch is rolled back, nothing is pushed."""
    await pool.execute(
        """CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN IF NEW.name = 'boom' THEN RAISE EXCEPTION 'boom refused'; END IF; RETURN NEW; END $$;
           CREATE TRIGGER refuse_boom BEFORE INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION refuse_boom();"""
    )
    batch = [{"name": "boom" if i == 600 else "c"} for i in range(1000)]
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as client:
        with pytest.raises(StoreError) as info:
            await client.enqueue_many(batch)
        assert "boom refused" in str(info.value)
        assert await pool.fetchval("SELECT count(*) FROM tasks") == 0
        assert await pool.fetchval("SELECT count(*) FROM task_search") == 0
        assert await redis_client.zcard(keys.ready("default")) == 0
        made = await client.enqueue_many([{"name": "c"} for _ in range(1000)])  # the client goes on
    assert len(made) == await pool.fetchval("SELECT count(*) FROM tasks") == 1000


async def test_an_invalid_payload_late_in_a_copied_batch_writes_nothing(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    """Task 550 of 600 fails while the chunks before it were already copied: the transaction rolls back."""
    batch: list[dict[str, Any]] = [{"name": "c"} for _ in range(600)]
    batch[550]["payload"] = {1, 2}
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as client:
        with pytest.raises(taskmesh.InvalidTaskError) as info:
            await client.enqueue_many(batch)
        after = await client.enqueue_many([{"name": "c"} for _ in range(100)])  # the connection is usable again
    assert str(info.value) == "tasks[550].payload: is not JSON-serialisable: Type is not JSON serializable: set"
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 100 == len(after)
    assert await redis_client.zcard(keys.ready("default")) == 100


@pytest.mark.parametrize(
    ("index", "bad", "message"),
    [
        (612, {"priority": 2000}, "tasks[612].priority: Input should be less than or equal to 1000"),
        (30, {"name": "bad name"}, "tasks[30].name: String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'"),
        (999, {"extra": 1}, "tasks[999].extra: unknown field"),
        (400, {"delay_seconds": "soon"}, "tasks[400].delay_seconds: must be a number of seconds"),
        (70, {"delay_seconds": False}, "tasks[70].delay_seconds: must be a number of seconds"),
    ],
)
async def test_a_task_the_client_refuses_late_in_a_copied_batch_writes_nothing(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, index: int, bad: dict[str, Any], message: str
) -> None:
    """The client validates a copied batch slice by slice while PostgreSQL copies the slices before it:
    an invalid task in a later slice names its index in the batch and rolls the copied ones back."""
    batch: list[dict[str, Any]] = [{"name": "c", "payload": {"i": i}} for i in range(1000)]
    batch[index].update(bad)
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as client:
        with pytest.raises(taskmesh.InvalidTaskError) as info:
            await client.enqueue_many(batch)
    assert str(info.value) == message
    assert [field for field, _ in info.value.errors] == [message.split(":")[0]]
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


class Report(BaseModel):
    report_id: str


@pytest.mark.parametrize(
    ("index", "bad", "message"),
    [
        (777, {"name": "copy.model", "payload": {}}, "tasks[777].payload.report_id: Field required"),
        (
            88,
            {"payload": {"n": [1, 2**64]}},
            "tasks[88].payload.n[1]: integer beyond 64 bits (-2^63 .. 2^64-1); send it as a string",
        ),
        (
            301,
            {"name": "plain", "payload": b"raw"},
            "tasks[301].payload: is not JSON-serialisable: Type is not JSON serializable: bytes",
        ),
    ],
)
async def test_a_payload_refused_late_in_a_copied_batch_names_its_task_and_writes_nothing(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, index: int, bad: dict[str, Any], message: str
) -> None:
    """A copied task's payload is checked against its handler and serialised as it is prepared; the
    field names its task's index only when it is refused (formatting it for every task cost time)."""
    registry = Registry()

    @registry.task("copy.model")
    async def model(payload: Report) -> None:
        return None

    batch: list[dict[str, Any]] = [{"name": "copy.model", "payload": {"report_id": str(i)}} for i in range(1000)]
    batch[index].update(bad)
    async with taskmesh.Client(
        database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, registry=registry
    ) as client:
        with pytest.raises(taskmesh.InvalidTaskError) as info:
            await client.enqueue_many(batch)
    assert str(info.value) == message
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_a_copied_batch_over_several_queues_pushes_each_task_to_its_own_queue_at_its_priority(
    database_url: str, redis_url: str, prefix: str, redis_client: aioredis.Redis, keys: Keys
) -> None:
    """The copied tasks' push targets are held by queue until the push (``ReadyTargets``): each task
    still reaches its own queue's ready set, scored by its priority."""
    queues = ("q0", "q1", "q2")
    priority = [i % 7 for i in range(300)]
    batch: list[dict[str, Any]] = [
        {"name": "c", "queue_name": queues[i % 3], "priority": priority[i]} for i in range(300)
    ]
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as client:
        made = await client.enqueue_many(batch)
    for q in queues:
        members = [str(m) for m in await redis_client.zrange(keys.ready(q), 0, -1)]
        expected = {str(m.task_id) for m in made if m.queue == q}
        assert set(members) == expected and len(expected) == 100
        by_id = {str(m.task_id): priority[i] for i, m in enumerate(made)}
        priorities = [by_id[m] for m in members]
        assert priorities == sorted(priorities, reverse=True)  # the highest priority pops first


@pytest.mark.parametrize("count", [3, 100])
async def test_enqueue_many_takes_any_mapping_and_leaves_the_callers_dicts_as_they_were(
    database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, redis_client: aioredis.Redis, count: int
) -> None:
    """Read-only mappings are copied into dicts; dicts are read as they are (3 go by INSERT, 100 by COPY)."""
    dicts: list[dict[str, Any]] = [{"name": "c", "payload": {"i": i}} for i in range(count)]
    before = copy.deepcopy(dicts)
    frozen = [MappingProxyType({"name": "m", "priority": 5}) for _ in range(count)]
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE) as client:
        made = await client.enqueue_many(dicts) + await client.enqueue_many(frozen)
    assert dicts == before
    assert len({m.task_id for m in made}) == 2 * count
    rows = await pool.fetch("SELECT name, priority, count(*) AS n FROM tasks GROUP BY 1, 2 ORDER BY 1")
    assert [tuple(r) for r in rows] == [("c", 0, count), ("m", 5, count)]
    assert await redis_client.zcard(Keys(prefix).ready("default")) == 2 * count  # and the fixture deletes them
