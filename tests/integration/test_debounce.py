"""Debounce and throttle at create, real stores: the last create of a key within the window runs, never past
``max_wait``, a started task is never replaced; at most one task of a throttle key per window; bad
combinations refused with their exact message."""

from __future__ import annotations

import time
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.tasks.debounce import throttled
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.validation import TaskSpec
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"


def register(registry: Registry, seconds: float = 0.0) -> list[tuple[float, Any]]:
    ran: list[tuple[float, Any]] = []

    @registry.task("deb.job")
    async def job(payload: Any) -> None:
        ran.append((time.monotonic(), payload))
        await anyio.sleep(seconds)

    return ran


async def post(client: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = await client.post(TASKS, json={"name": "deb.job", **body})
    return r.status_code, r.json()


async def test_the_last_create_within_the_window_runs_once_with_its_payload(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ran = register(registry)
    async with start_instance() as inst, http(inst) as client:
        answers = []
        for n in range(5):
            answers.append(await post(client, {"payload": {"n": n}, "debounce": {"key": "doc-1", "seconds": 0.6}}))
            await anyio.sleep(0.1)
        await wait_for(lambda: _ran(ran, 1), timeout=10)
        await anyio.sleep(0.8)  # nothing else comes
    assert [s for s, _ in answers] == [201, 200, 200, 200, 200]
    assert len({a["task_id"] for _, a in answers}) == 1
    assert [p for _, p in ran] == [{"n": 4}]
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1


async def test_a_debounced_task_starts_by_its_max_wait_however_often_it_is_replaced(
    start_instance: Any, registry: Registry
) -> None:
    ran = register(registry)
    async with start_instance() as inst, http(inst) as client:
        started = time.monotonic()
        for n in range(12):  # a create every 0.2 s for 2.4 s, each pushing the start 0.5 s back
            await post(client, {"payload": {"n": n}, "debounce": {"key": "k", "seconds": 0.5, "max_wait": 1.0}})
            await anyio.sleep(0.2)
        await wait_for(lambda: _ran(ran, 2), timeout=10)
    first_at, _ = ran[0]
    assert 0.9 <= first_at - started <= 1.6, first_at - started  # by its max_wait, not 0.5 s after the last create
    assert len(ran) <= 3


async def test_a_started_task_is_never_replaced_the_next_create_makes_a_new_one(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ran = register(registry, seconds=1.0)
    async with start_instance() as inst, http(inst) as client:
        _, first = await post(client, {"payload": {"n": 1}, "debounce": {"key": "k", "seconds": 0.2}})
        await wait_for(lambda: _ran(ran, 1), timeout=10)  # running now
        status, second = await post(client, {"payload": {"n": 2}, "debounce": {"key": "k", "seconds": 0.2}})
        await wait_for(lambda: _ran(ran, 2), timeout=10)
    assert status == 201 and second["task_id"] != first["task_id"]
    assert [p for _, p in ran] == [{"n": 1}, {"n": 2}]


async def test_throttled_creates_of_one_window_dedup_to_one_task(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ran = register(registry)
    async with start_instance() as inst, http(inst) as client:
        answers = [
            await post(client, {"payload": {"n": n}, "throttle": {"key": "sync", "seconds": 3600}}) for n in range(5)
        ]
        other = await post(client, {"throttle": {"key": "other", "seconds": 3600}})
        await wait_for(lambda: _ran(ran, 2), timeout=10)
    assert [s for s, _ in answers] == [201, 200, 200, 200, 200]
    assert len({a["task_id"] for _, a in answers}) == 1 and other[0] == 201
    assert sorted(str(p) for _, p in ran) == sorted([str({"n": 0}), str({})])


def test_a_throttle_key_changes_with_its_window() -> None:
    spec = TaskSpec(name="t", throttle={"key": "sync", "seconds": 2})
    assert throttled(spec, 10_000).dedup_key == "throttle:sync:5"
    assert throttled(spec, 11_999).dedup_key == "throttle:sync:5"
    assert throttled(spec, 12_000).dedup_key == "throttle:sync:6"


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"dedup_key": "a", "debounce": {"key": "k", "seconds": 1}},
            "body",
            "give one of dedup_key, debounce and throttle",
        ),
        (
            {"debounce": {"key": "k", "seconds": 1}, "delay_seconds": 5},
            "body",
            "debounce decides when the task runs: give no delay_seconds or run_at",
        ),
        ({"debounce": {"key": "k", "seconds": 2, "max_wait": 1}}, "debounce", "max_wait must be at least seconds"),
        (
            {"debounce": {"key": "k", "seconds": 0}},
            "debounce.seconds",
            "Input should be greater than or equal to 0.001",
        ),
        (
            {"throttle": {"key": "k", "seconds": 2e-224}},
            "throttle.seconds",
            "Input should be greater than or equal to 0.001",
        ),
        ({"throttle": {"key": "", "seconds": 1}}, "throttle.key", "String should have at least 1 character"),
    ],
)
async def test_bad_debounce_and_throttle_are_refused_naming_the_field(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, body: dict[str, Any], field: str, message: str
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        status, answer = await post(client, body)
    assert status == 422, answer
    assert answer["errors"][0] == {"field": field, "message": message}
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def _ran(ran: list[Any], n: int) -> bool:
    return len(ran) >= n
