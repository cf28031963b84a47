"""Refused authentication is limited per client address, and a flood of refusals writes a bounded number
of audit rows: the first of each kind in a window, then one summary row with the count.

Real instances over HTTP on loopback (every request comes from 127.0.0.1), real PostgreSQL and
Redis; one test stops its instance's own Redis halfway.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import orjson
import pytest

from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.services import denial_summaries
from tests.conftest import http, redis_server, running

pytestmark = pytest.mark.anyio

BUDGET = {"auth_refusals_per_minute": 10.0, "workers_enabled": False}


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions")


def made_up_key() -> str:
    """A key of the right form that nobody made (a new id each time, as a guesser sends)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    return "tmk_" + "".join(secrets.choice(alphabet) for _ in range(16)) + "_" + secrets.token_hex(24)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def rows(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    found = await pool.fetch("SELECT action, actor_type, outcome, status, client_addr, details FROM audit_events")
    return [{**r, "details": orjson.loads(r["details"]) if r["details"] else {}} for r in found]


async def test_refused_authentication_past_an_addresss_budget_answers_429_and_a_good_key_still_works(
    start_instance: Any, stores: Any
) -> None:
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(**BUDGET) as inst, http(inst) as client:
        codes = [(await client.get("/api/v1/tasks", headers=bearer(made_up_key()))).status_code for _ in range(30)]
        last = await client.get("/api/v1/workers")  # no key at all counts too
        good = await client.get("/api/v1/workers", headers=bearer(admin))
        sign_in = await client.post(
            "/console/sign-in",
            data={"key": made_up_key()},
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    assert codes[:10] == [401] * 10 and set(codes[10:]) == {429}, codes
    assert last.status_code == 429
    assert last.headers["content-type"] == "application/problem+json"
    assert int(last.headers["retry-after"]) >= 1
    assert last.headers["ratelimit-policy"] == '"auth";q=10;w=60'
    body = last.json()
    assert (body["title"], body["status"], body["policy"]) == ("Too many requests", 429, "auth")
    assert body["detail"].startswith("more than 10 refused authentications from 127.0.0.1 in 60 s; retry in ")
    assert good.status_code == 200  # a working key from the same address is never refused here
    assert sign_in.status_code == 429 and "more than 10 refused authentications" in sign_in.text
    assert int(sign_in.headers["retry-after"]) >= 1


async def test_a_flood_of_refusals_writes_the_first_of_each_kind_and_then_one_summary_with_the_count(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    await api_keys.create(stores.pg, "admin", list(SCOPES))  # the instance enforces keys
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with start_instance(**BUDGET) as inst, http(inst) as client:
        assert inst.state is not None
        codes = [(await client.get("/api/v1/tasks", headers=bearer(made_up_key()))).status_code for _ in range(300)]
        for _ in range(20):
            await client.post("/console/sign-in", data={"key": made_up_key()}, headers=form)
        during = await rows(pool)
        inst.state.denials.window = 0.0  # the minute is over: the summaries are due
        await denial_summaries.run_once(stores.pg, inst.state.denials)
    assert codes.count(401) == 10 and codes.count(429) == 290, codes
    assert sorted((r["action"], r["status"], r["details"]) for r in during) == [
        ("GET /api/v1/tasks", 401, {"refused": "unknown_key"}),
        ("GET /api/v1/tasks", 429, {"refused": "unknown_key", "throttled": True}),
    ]
    after = await rows(pool)
    summaries = sorted((r for r in after if r["action"] == "denied.repeated"), key=lambda r: r["status"])
    assert len(after) == 4 and len(summaries) == 2
    assert [(s["actor_type"], s["outcome"], s["status"], s["client_addr"]) for s in summaries] == [
        ("anonymous", "denied", 401, "127.0.0.1"),
        ("anonymous", "denied", 429, "127.0.0.1"),
    ]
    refused, throttled = (s["details"] for s in summaries)
    assert (refused["count"], refused["actions"], refused["refused"]) == (9, {"GET /api/v1/tasks": 9}, "unknown_key")
    assert (throttled["count"], throttled["actions"]) == (309, {"GET /api/v1/tasks": 289, "console.sign_in": 20})
    assert (len(refused["key_ids"]), len(throttled["key_ids"])) == (9, 20)  # a sample of the ids tried, never secrets
    assert refused["first_at"] <= refused["last_at"] and refused["window_seconds"] == 0.0


async def test_while_redis_is_down_refusals_answer_401_and_the_audit_log_stays_bounded(
    make_settings: Any, registry: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    await api_keys.create(stores.pg, "admin", list(SCOPES))
    with contextlib.ExitStack() as own_redis:
        port = own_redis.enter_context(redis_server())
        settings = make_settings(**BUDGET, redis_url=f"redis://127.0.0.1:{port}/0", redis_mode="standalone")
        async with running(settings, registry) as inst, http(inst) as client:
            own_redis.close()  # Redis stops: the refusals' budget cannot be read
            answers = [await client.get("/api/v1/tasks", headers=bearer(made_up_key())) for _ in range(50)]
            written = await rows(pool)
    assert {a.status_code for a in answers} == {401}
    assert [(r["action"], r["status"]) for r in written] == [("GET /api/v1/tasks", 401)]
