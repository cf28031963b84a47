"""The task limits' routes on real instances: ``GET /api/v1/limits``, ``GET/PUT/DELETE /api/v1/limits/{limit}``
and ``blocked_by`` of ``GET /api/v1/tasks/{id}``.

Every bad input answers its exact problem and sets nothing; a limit nobody has, and an unset of one never
set at run time, are not found; setting needs ``queues:admin``, and a queue-bound key may set only a limit
of its queues; a set and an unset are audited; a limit set on one instance holds on another within a
second, raised or lowered; the list shows configured and runtime limits with their ``source`` and what
each holds while tasks run; and a waiting task says what it waits for.

How the limits hold runs at once and starts per second is in ``test_limits.py``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import anyio
import asyncpg
import httpx
import orjson
import pytest
import redis.asyncio as aioredis

import taskmesh
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

LIMITS = "/api/v1/limits"
TASKS = "/api/v1/tasks"
NAME_RULE = "must match [a-z0-9][a-z0-9_-]{0,63}"


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions, limits")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def invalid(field: str, message: str) -> dict[str, Any]:
    """The 422 problem naming one field."""
    return {
        "type": "about:blank",
        "title": "Invalid request",
        "status": 422,
        "detail": f"{field}: {message}",
        "errors": [{"field": field, "message": message}],
    }


def not_found(detail: str) -> dict[str, Any]:
    return {"type": "about:blank", "title": "Limit not found", "status": 404, "detail": detail}


def forbidden(detail: str) -> dict[str, Any]:
    return {"type": "about:blank", "title": "Forbidden", "status": 403, "detail": detail, "scope": "queues:admin"}


async def create(client: httpx.AsyncClient, body: dict[str, Any], n: int = 1) -> list[str]:
    made = await client.post(f"{TASKS}:batch", json={"tasks": [body] * n})
    assert made.status_code == 200 and made.json()["created"] == n, made.text
    return [r["task_id"] for r in made.json()["results"]]


async def blocked_by(client: httpx.AsyncClient, task_id: str) -> Any:
    got = await client.get(f"{TASKS}/{task_id}")
    assert got.status_code == 200, got.text
    return got.json()["task"]["blocked_by"]


async def test_every_bad_input_answers_its_exact_problem_and_sets_nothing(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    bodies: list[tuple[Any, str, str]] = [
        ({"concurrency": 1, "max": 3}, "max", "unknown field"),
        ({"concurrency": 0}, "concurrency", "Input should be greater than or equal to 1"),
        ({"concurrency": 100_001}, "concurrency", "Input should be less than or equal to 100000"),
        ({"concurrency": "2"}, "concurrency", "Input should be a valid integer"),
        ({"rate": "20 per second"}, "rate", "rate '20 per second' must look like 20/s, 600/m or 5/h"),
        ({"rate": "0/s"}, "rate", "rate '0/s' must be above 0 and at most 100000/s"),
        ({"rate": "20/s", "burst": 0}, "burst", "Input should be greater than or equal to 1"),
        ({"concurrency": 2, "burst": 5}, "body", "burst counts starts of a rate: give rate too, or no burst"),
        ({"queue": "default", "task": "send"}, "body", "a limit needs concurrency, rate, or both"),
        ({}, "body", "a limit needs concurrency, rate, or both"),
        (
            {"key": "customer", "concurrency": 1},
            "key",
            "must be tenant_id or payload.<path> (names of [A-Za-z0-9_-], at most 8 deep)",
        ),
        (
            {"key": "payload.a.b.c.d.e.f.g.h.i", "concurrency": 1},
            "key",
            "must be tenant_id or payload.<path> (names of [A-Za-z0-9_-], at most 8 deep)",
        ),
        ({"queue": "no spaces", "concurrency": 1}, "queue", "String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'"),
        ([{"concurrency": 1}], "body", "must be a JSON object"),
        ("concurrency=1", "body", "must be a JSON object"),
    ]
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        for body, field, message in bodies:
            refused = await client.put(f"{LIMITS}/api", json=body)
            assert (refused.status_code, refused.json()) == (422, invalid(field, message)), body
        for name in ("Api", "-api", "api:42", "a" * 65, "a.b"):
            for method in ("GET", "PUT", "DELETE"):
                refused = await client.request(method, f"{LIMITS}/{name}", json={"concurrency": 1})
                assert (refused.status_code, refused.json()) == (422, invalid("limit", NAME_RULE)), (method, name)
        malformed = await client.put(f"{LIMITS}/api", content=b"{concurrency: 1}")
        assert (malformed.status_code, malformed.json()["title"]) == (400, "Malformed JSON"), malformed.text
        listed = await client.get(LIMITS)
    assert listed.json() == {"limits": []}
    assert await pool.fetchval("SELECT count(*) FROM limits") == 0


async def test_a_limit_nobody_has_and_an_unset_of_one_never_set_at_run_time_are_not_found(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    configured = {"api": {"task": "x", "concurrency": 2}}
    async with start_instance(workers_enabled=False, limits=configured) as inst, http(inst) as client:
        unknown = await client.get(f"{LIMITS}/none-such")
        unset_unknown = await client.delete(f"{LIMITS}/none-such")
        unset_configured = await client.delete(f"{LIMITS}/api")
        still = await client.get(f"{LIMITS}/api")
        await client.put(f"{LIMITS}/once", json={"concurrency": 1})
        first = await client.delete(f"{LIMITS}/once")
        second = await client.delete(f"{LIMITS}/once")
        gone = await client.get(f"{LIMITS}/once")
    assert (unknown.status_code, unknown.json()) == (404, not_found("no limit is named 'none-such'"))
    assert (unset_unknown.status_code, unset_unknown.json()) == (
        404,
        not_found("no limit named 'none-such' was set at run time"),
    )
    assert (unset_configured.status_code, unset_configured.json()) == (
        404,
        not_found("no limit named 'api' was set at run time"),
    )
    assert (still.status_code, still.json()["source"], still.json()["concurrency"]) == (200, "config", 2)
    assert (first.status_code, first.content) == (204, b"")
    assert (second.status_code, second.json()) == (404, not_found("no limit named 'once' was set at run time"))
    assert (gone.status_code, gone.json()) == (404, not_found("no limit is named 'once'"))


async def test_setting_a_limit_needs_queues_admin_and_a_queue_bound_key_sets_only_limits_of_its_queues(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    reader = (await api_keys.create(stores.pg, "reader", ["tasks:read"])).key
    reports = (await api_keys.create(stores.pg, "reports", list(SCOPES), queues=["reports"])).key
    configured = {"everywhere": {"task": "x", "concurrency": 2}, "reports-only": {"queue": "reports", "concurrency": 2}}
    async with start_instance(workers_enabled=False, limits=configured) as inst, http(inst) as client:
        read = await client.get(LIMITS, headers=bearer(reader))
        put = await client.put(f"{LIMITS}/mine", json={"concurrency": 1}, headers=bearer(reader))
        unset = await client.delete(f"{LIMITS}/everywhere", headers=bearer(reader))
        spanning = await client.put(f"{LIMITS}/mine", json={"concurrency": 1}, headers=bearer(reports))
        elsewhere = await client.put(
            f"{LIMITS}/mine", json={"queue": "default", "concurrency": 1}, headers=bearer(reports)
        )
        # A limit of its queue, under the name of a configured one that spans every queue.
        narrowed = await client.put(
            f"{LIMITS}/everywhere", json={"queue": "reports", "concurrency": 1}, headers=bearer(reports)
        )
        unset_spanning = await client.delete(f"{LIMITS}/everywhere", headers=bearer(reports))
        own = await client.put(
            f"{LIMITS}/reports-only", json={"queue": "reports", "rate": "5/s"}, headers=bearer(reports)
        )
        own_unset = await client.delete(f"{LIMITS}/reports-only", headers=bearer(reports))
        by_admin = await client.put(f"{LIMITS}/mine", json={"concurrency": 1}, headers=bearer(admin))
    lacking = {"type": "about:blank", "title": "Forbidden", "status": 403, "scope": "queues:admin"}
    assert read.status_code == 200
    assert (put.status_code, put.json()) == (403, {**lacking, "detail": "this key lacks the scope 'queues:admin'"})
    assert (unset.status_code, unset.json()) == (403, {**lacking, "detail": "this key lacks the scope 'queues:admin'"})
    assert (spanning.status_code, spanning.json()) == (
        403,
        forbidden("setting a limit spans every queue; this key is bound to some queues"),
    )
    assert (elsewhere.status_code, elsewhere.json()["errors"]) == (
        403,
        [{"field": "queue", "message": "this key may use the queues reports; not 'default'"}],
    )
    assert (narrowed.status_code, narrowed.json()) == (
        403,
        forbidden("changing this limit spans every queue; this key is bound to some queues"),
    )
    assert (unset_spanning.status_code, unset_spanning.json()) == (
        403,
        forbidden("changing this limit spans every queue; this key is bound to some queues"),
    )
    assert (own.status_code, own.json()["rate"], own_unset.status_code) == (200, "5/s", 204), own.text
    assert by_admin.status_code == 200
    assert [r["name"] for r in await pool.fetch("SELECT name FROM limits")] == ["mine"]


async def test_a_set_and_an_unset_are_audited_with_the_limit_and_its_numbers(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    admin = await api_keys.create(stores.pg, "ops", list(SCOPES))
    key_id = admin.record["key_id"]
    body = {"queue": "emails", "key": "payload.customer", "concurrency": 3, "rate": "20/s", "burst": 5}
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        put = await client.put(f"{LIMITS}/per-customer", json=body, headers=bearer(admin.key))
        unset = await client.delete(f"{LIMITS}/per-customer", headers=bearer(admin.key))
    assert put.status_code == 200 and unset.status_code == 204
    answer = put.json()
    assert {k: answer[k] for k in (*body, "name", "task", "source", "updated_by", "usage")} == {
        **body,
        "name": "per-customer",
        "task": None,
        "source": "api",
        "updated_by": key_id,
        "usage": [],
    }
    assert abs(datetime.fromisoformat(answer["updated_at"]) - datetime.now(UTC)) < timedelta(seconds=30)
    rows = await pool.fetch(
        "SELECT actor_id, action, resource_type, resource_id, outcome, details FROM audit_events ORDER BY at, id"
    )
    seen = [(r["actor_id"], r["action"], r["resource_type"], r["resource_id"], r["outcome"]) for r in rows]
    assert seen == [
        (key_id, "limit.set", "limit", "per-customer", "ok"),
        (key_id, "limit.unset", "limit", "per-customer", "ok"),
    ]
    assert orjson.loads(rows[0]["details"]) == {"limit": "per-customer", **body}


class Ledger:
    """Runs at once as the handler sees them: ``(start time, runs at once then)`` per start."""

    def __init__(self) -> None:
        self.now = 0
        self.starts: list[tuple[float, int]] = []

    def most_since(self, moment: float) -> int:
        return max((n for t, n in self.starts if t >= moment), default=0)

    async def started(self, n: int) -> bool:
        return len(self.starts) >= n

    async def running(self, n: int) -> bool:
        return self.now == n


async def test_a_limit_set_on_one_instance_holds_on_another_within_a_second_raised_or_lowered(
    start_instance: Any, registry: Registry, redis_client: aioredis.Redis, keys: Keys
) -> None:
    ledger = Ledger()

    @registry.task("lim.job")
    async def job(payload: Any) -> None:
        ledger.now += 1
        ledger.starts.append((time.monotonic(), ledger.now))
        try:
            await anyio.sleep(0.1)
        finally:
            ledger.now -= 1

    limits = {"api": {"task": "lim.job", "concurrency": 1}}
    parked = keys.limit_base("default") + "parked:api"
    async with (
        start_instance(workers_enabled=False, limits=limits) as a,
        start_instance(worker_concurrency=8, limits=limits) as b,
        http(a) as on_a,
    ):
        await create(on_a, {"name": "lim.job"}, 120)
        await wait_for(partial(ledger.started, 3))
        assert ledger.most_since(0) == 1 and await redis_client.exists(parked)

        raised = await on_a.put(f"{LIMITS}/api", json={"task": "lim.job", "concurrency": 3})
        assert raised.status_code == 200, raised.text
        t0 = time.monotonic()
        await wait_for(partial(ledger.running, 3), timeout=5, interval=0.005)
        took_to_raise = time.monotonic() - t0

        lowered = await on_a.put(f"{LIMITS}/api", json={"task": "lim.job", "concurrency": 1})
        assert lowered.status_code == 200, lowered.text
        t1 = time.monotonic()
        await anyio.sleep(2.5)
        parked_after = await redis_client.zcard(parked)
        assert b.worker_id  # B is the instance that ran them
    # B reads the limits every second; a run that ends then frees what the new number lets start (measured
    # 0.24 to 0.68 s here).
    assert took_to_raise < 1.5, took_to_raise
    # Lowered: after a second and a start's latency (measured 0.84 to 0.97 s), one at a time.
    assert ledger.most_since(t1 + 1.5) == 1, [(round(t - t1, 2), n) for t, n in ledger.starts if t >= t1]
    assert parked_after > 0  # the rest wait parked, not in B's executors


async def test_the_list_shows_configured_and_runtime_limits_with_their_source_and_what_each_holds(
    start_instance: Any, registry: Registry
) -> None:
    release = anyio.Event()

    @registry.task("lim.hold")
    async def hold(payload: Any) -> None:
        await release.wait()

    @registry.task("lim.other")
    async def other(payload: Any) -> None:
        await release.wait()

    configured = {"api": {"task": "lim.hold", "concurrency": 2}}
    per_customer = {"task": "lim.other", "key": "payload.customer", "concurrency": 1}
    async with start_instance(worker_concurrency=8, limits=configured) as inst, http(inst) as client:
        try:
            put = await client.put(f"{LIMITS}/per-customer", json=per_customer)
            assert put.status_code == 200, put.text
            await create(client, {"name": "lim.hold"}, 3)
            await create(client, {"name": "lim.other", "payload": {"customer": "acme"}}, 2)

            async def both_held() -> Any:
                answer = (await client.get(LIMITS)).json()["limits"]
                return answer if all(x["usage"] and x["usage"][0]["waiting"] for x in answer) else None

            listed = await wait_for(both_held)
            overridden = await client.put(f"{LIMITS}/api", json={"task": "lim.hold", "concurrency": 5})
            unset = await client.delete(f"{LIMITS}/api")
            back = await client.get(f"{LIMITS}/api")
        finally:
            release.set()
    api, customer = listed
    assert api == {
        "name": "api",
        "queue": None,
        "task": "lim.hold",
        "key": None,
        "concurrency": 2,
        "rate": None,
        "burst": 1,
        "source": "config",
        "updated_at": None,
        "updated_by": None,
        "usage": [{"queue": "default", "key": "api", "in_use": 2, "waiting": 1, "backing_off_until_ms": None}],
    }
    assert {k: customer[k] for k in ("name", "key", "concurrency", "source", "updated_by", "usage")} == {
        "name": "per-customer",
        "key": "payload.customer",
        "concurrency": 1,
        "source": "api",
        "updated_by": None,  # an open instance's caller has no key
        "usage": [
            {"queue": "default", "key": "per-customer:acme", "in_use": 1, "waiting": 1, "backing_off_until_ms": None}
        ],
    }
    assert customer["updated_at"] is not None
    assert (overridden.json()["source"], overridden.json()["concurrency"]) == ("api", 5)
    assert overridden.json()["usage"][0]["in_use"] == 2  # the runs in its slots are the same runs
    assert unset.status_code == 204
    assert (back.json()["source"], back.json()["concurrency"], back.json()["updated_at"]) == ("config", 2, None)


async def test_blocked_by_names_what_each_waiting_task_waits_for(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    release = anyio.Event()
    limited_once: list[str] = []

    @registry.task("lim.hold")
    async def hold(payload: Any) -> None:
        await release.wait()

    @registry.task("lim.quick")
    async def quick(payload: Any) -> None:
        return None

    @registry.task("lim.call")
    async def call(payload: Any, ctx: Any) -> None:
        if not limited_once:
            limited_once.append(str(ctx.task_id))
            raise taskmesh.RateLimited(retry_after=600)

    limits = {
        # A rate too that has room: what holds the waiting task is its concurrency, and says so.
        "one-at-a-time": {"task": "lim.hold", "concurrency": 1, "rate": "1000/s"},
        "hourly": {"task": "lim.quick", "queue": "default", "rate": "1/h"},
        "provider": {"task": "lim.call", "rate": "100/s"},
    }
    async with start_instance(worker_concurrency=8, limits=limits) as inst, http(inst) as client:
        try:
            running, held = await create(client, {"name": "lim.hold"}, 2)
            await wait_for(lambda: blocked_by(client, held))
            await wait_for(lambda: _status_is(pool, running, "running"))  # claimed just after its admission
            assert await blocked_by(client, held) == [
                {"reason": "limit", "limit": "one-at-a-time", "key": "one-at-a-time", "holds": "concurrency"}
            ]
            assert await blocked_by(client, running) is None  # running: not waiting

            done, spaced = await create(client, {"name": "lim.quick"}, 2)
            await wait_for(lambda: blocked_by(client, spaced))
            assert await blocked_by(client, spaced) == [
                {"reason": "limit", "limit": "hourly", "key": "hourly", "holds": "rate"}
            ]
            assert (await client.get(f"{TASKS}/{done}?wait=10")).json()["task"]["status"] == "completed"
            assert await blocked_by(client, done) is None  # over: not waiting

            [first] = await create(client, {"name": "lim.call"})
            await wait_for(lambda: _retrying(pool, first))
            backed_off_at = datetime.now(UTC)
            [later] = await create(client, {"name": "lim.call"})
            await wait_for(lambda: blocked_by(client, later))
            [reason] = await blocked_by(client, later)
            until = datetime.fromtimestamp(reason.pop("until_ms") / 1000, UTC)
            assert reason == {"reason": "limit", "limit": "provider", "key": "provider", "holds": "back_off"}
            assert timedelta(seconds=590) < until - backed_off_at < timedelta(seconds=600), until

            [delayed] = await create(client, {"name": "lim.quick", "delay_seconds": 3600})
            got = (await client.get(f"{TASKS}/{delayed}")).json()["task"]
            assert got["blocked_by"] == [{"reason": "delay", "until": got["run_at"]}]

            paused = await client.post("/api/v1/queues/held/pause", json={"reason": "test"})
            assert paused.status_code == 200, paused.text
            [in_paused] = await create(client, {"name": "lim.quick", "queue_name": "held"})
            assert await blocked_by(client, in_paused) == [{"reason": "queue_paused"}]

            [ready] = await create(client, {"name": "lim.quick", "queue_name": "unserved"})
            assert await blocked_by(client, ready) == []  # ready: waiting for an executor

            graph = {
                "name": "chain",
                "nodes": [{"id": "a", "task": "lim.hold"}, {"id": "b", "task": "lim.quick", "deps": ["a"]}],
            }
            workflow = (await client.post("/api/v1/workflows", json=graph)).json()["workflow_id"]
            node = await pool.fetchval(
                "SELECT id FROM tasks WHERE workflow_id = $1 AND workflow_node = 'b'", uuid.UUID(workflow)
            )
            assert await blocked_by(client, str(node)) == [{"reason": "workflow", "workflow_id": workflow}]
        finally:
            release.set()


async def _status_is(pool: asyncpg.Pool, task_id: str, status: str) -> bool:
    return bool(await pool.fetchval("SELECT status FROM tasks WHERE id = $1", uuid.UUID(task_id)) == status)


async def _retrying(pool: asyncpg.Pool, task_id: str) -> bool:
    """The first run of ``task_id`` ended ``retrying`` (a ``RateLimited``): its key's back-off has begun."""
    status = await pool.fetchval("SELECT status FROM task_runs WHERE task_id = $1 AND attempt = 1", uuid.UUID(task_id))
    return bool(status == "retrying")
