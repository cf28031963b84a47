"""The console's sessions and forms over plain HTTP: what a forged, stale or foreign request gets.

No browser here: these requests are the ones a browser would refuse to make, or an attacker's
page would try. Each names the exact status and message.
"""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import httpx
import pytest

from taskmesh.console.guard import CSP
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.services import retention
from tests.conftest import wait_for

pytestmark = pytest.mark.anyio


def client_of(inst: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{inst.port}", timeout=10)


async def signed_in(client: httpx.AsyncClient, key: str) -> str:
    """Sign in with ``key``; returns the session's CSRF token (the cookie stays in ``client``)."""
    answer = await client.post("/console/sign-in", data={"key": key, "next": "/console/queues"})
    assert (answer.status_code, answer.headers["location"]) == (303, "/console/queues"), answer.text
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=28800" in cookie, cookie
    page = await client.get("/console/queues")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token is not None, page.text
    return token.group(1)


async def test_a_change_needs_the_sessions_csrf_token_and_the_consoles_own_origin(
    start_instance: Any, stores: Any
) -> None:
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(workers_enabled=False) as inst, client_of(inst) as client:
        token = await signed_in(client, admin)
        no_token = await client.post("/console/queues/default/pause", data={})
        wrong = await client.post("/console/queues/default/pause", data={"csrf_token": token[:-2] + "xx"})
        cross = await client.post(
            "/console/queues/default/pause", data={"csrf_token": token}, headers={"Sec-Fetch-Site": "cross-site"}
        )
        foreign = await client.post(
            "/console/queues/default/pause", data={"csrf_token": token}, headers={"Origin": "https://evil.example"}
        )
        other_port = await client.post(
            "/console/queues/default/pause",
            data={"csrf_token": token},
            headers={"Origin": f"http://127.0.0.1:{inst.port + 1}"},
        )
        api_no_token = await client.post("/api/v1/queues/default/pause", json={})
        api_read = await client.get("/api/v1/queues/default")
        ok = await client.post("/console/queues/default/pause", data={"csrf_token": token, "reason": "deploy"})
        paused = (await client.get("/api/v1/queues/default")).json()
    needs_token = "a change with the console's session needs the session's CSRF token; reload the page"
    assert [
        (r.status_code, r.json()["detail"], r.json()["errors"][0]["field"]) for r in (no_token, wrong, api_no_token)
    ] == [(403, needs_token, "X-CSRF-Token")] * 3
    assert (cross.status_code, cross.json()["detail"]) == (403, "a change from another site (cross-site) is refused")
    assert (foreign.status_code, foreign.json()["detail"]) == (
        403,
        "a change from https://evil.example is refused: it is not this console's origin",
    )
    assert (other_port.status_code, other_port.json()["detail"]) == (
        403,
        f"a change from http://127.0.0.1:{inst.port + 1} is refused: it is not this console's origin",
    )
    assert api_read.status_code == 200  # the session reads the API as its key
    assert (ok.status_code, ok.headers["location"]) == (303, "/console/queues")
    assert (paused["paused"], paused["reason"]) == (True, "deploy")


async def test_every_console_answer_carries_the_strict_csp_and_no_page_is_served_without_a_session(
    start_instance: Any, stores: Any
) -> None:
    await api_keys.create(stores.pg, "admin", list(SCOPES))
    async with start_instance(workers_enabled=False) as inst, client_of(inst) as client:
        answers = {
            path: await client.get(path)
            for path in ("/console/overview", "/console/tasks?status=failed", "/console/audit", "/console/sign-in")
        }
        static = await client.get("/console/static/console.js")
        posted = await client.post("/console/queues/default/pause", data={"csrf_token": "x"})
    for path, answer in answers.items():
        assert answer.headers["content-security-policy"] == CSP, path
        assert answer.headers["x-frame-options"] == "DENY"
    assert answers["/console/overview"].status_code == 303
    assert answers["/console/overview"].headers["location"] == "/console/sign-in?next=/console/overview"
    assert answers["/console/tasks?status=failed"].headers["location"] == (
        "/console/sign-in?next=/console/tasks%3Fstatus%3Dfailed"
    )
    assert answers["/console/sign-in"].status_code == 200
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    assert (static.status_code, static.headers["content-type"].split(";")[0]) == (200, "text/javascript")
    assert posted.status_code == 303 and posted.headers["location"].startswith("/console/sign-in")


async def test_a_session_ends_with_its_expiry_its_keys_revocation_and_sign_out_and_retention_deletes_it(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    first = await api_keys.create(stores.pg, "alice", list(SCOPES))
    second = await api_keys.create(stores.pg, "bob", list(SCOPES))
    async with start_instance(workers_enabled=False) as inst:
        async with client_of(inst) as alice, client_of(inst) as bob:
            await signed_in(alice, first.key)
            await signed_in(bob, second.key)
            await pool.execute(
                "UPDATE console_sessions SET expires_at = now() - interval '1 s' WHERE key_id = $1",
                first.record["key_id"],
            )
            expired_page = await alice.get("/console/overview")
            expired_api = await alice.get("/api/v1/queues")
            await stores.pg.keys.revoke(second.record["key_id"])

            async def sent_away() -> httpx.Response | None:
                page = await bob.get("/console/overview")
                return page if page.status_code == 303 else None

            revoked = await wait_for(sent_away, timeout=8, interval=0.5)  # within the key cache's 5 s
    assert (expired_page.status_code, expired_page.headers["location"]) == (
        303,
        "/console/sign-in?next=/console/overview",
    )
    assert (expired_api.status_code, expired_api.json()["detail"]) == (
        401,
        "the console session is over: sign in again at /console/sign-in",
    )
    assert revoked.status_code == 303 and revoked.headers["location"].startswith("/console/sign-in")
    deleted = await retention.run_once(stores.pg, {})
    assert deleted == {"console_sessions": 1}
    assert await pool.fetchval("SELECT count(*) FROM console_sessions") == 1  # bob's: unexpired (its key is revoked)


async def test_a_sign_in_is_audited_with_the_keys_id_and_never_its_secret(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    made = await api_keys.create(stores.pg, "alice", list(SCOPES))
    async with start_instance(workers_enabled=False) as inst, client_of(inst) as client:
        refused = await client.post("/console/sign-in", data={"key": made.key[:-4] + "0000"})
        cross = await client.post("/console/sign-in", data={"key": made.key}, headers={"Sec-Fetch-Site": "cross-site"})
        foreign = await client.post(
            "/console/sign-in", data={"key": made.key}, headers={"Origin": "https://evil.example"}
        )
        await signed_in(client, made.key)
    assert refused.status_code == 401 and f"no valid key has id {made.record['key_id']}" in refused.text
    assert (cross.status_code, cross.json()["detail"]) == (403, "a sign-in from another site is refused")
    assert (foreign.status_code, foreign.json()["detail"]) == (
        403,
        "a change from https://evil.example is refused: it is not this console's origin",
    )
    rows = await pool.fetch("SELECT actor_id, actor_name, outcome, details::text AS d FROM audit_events ORDER BY id")
    assert [(r["actor_id"], r["actor_name"], r["outcome"]) for r in rows] == [
        (made.record["key_id"], None, "denied"),
        (made.record["key_id"], "alice", "ok"),
    ]
    assert all(made.key[21:] not in str(dict(r)) for r in rows)


async def test_the_console_is_not_served_when_console_enabled_is_false_and_an_open_instance_says_it_is_open(
    start_instance: Any,
) -> None:
    async with start_instance(workers_enabled=False, console_enabled=False) as inst, client_of(inst) as client:
        off = await client.get("/console/overview")
    async with start_instance(workers_enabled=False) as inst, client_of(inst) as client:
        sign_in = await client.get("/console/sign-in")
        page = await client.get("/console/overview")
    assert off.status_code == 404
    assert (sign_in.status_code, sign_in.headers["location"]) == (303, "/console/overview")
    assert page.status_code == 200
    assert "This instance is open: no API key was made yet" in page.text


async def test_the_session_cookie_is_secure_when_the_page_came_over_https_through_a_proxy(
    start_instance: Any, stores: Any
) -> None:
    made = await api_keys.create(stores.pg, "alice", list(SCOPES))
    async with start_instance(workers_enabled=False) as inst, client_of(inst) as client:
        plain = await client.post("/console/sign-in", data={"key": made.key})
        proxied = await client.post("/console/sign-in", data={"key": made.key}, headers={"X-Forwarded-Proto": "https"})
    assert "Secure" not in plain.headers["set-cookie"]
    assert "Secure" in proxied.headers["set-cookie"]


async def test_a_form_sent_after_the_session_ended_returns_to_its_page_after_sign_in(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    made = await api_keys.create(stores.pg, "alice", list(SCOPES))
    async with start_instance(workers_enabled=False) as inst, client_of(inst) as client:
        token = await signed_in(client, made.key)
        await pool.execute("UPDATE console_sessions SET expires_at = now() - interval '1 s'")
        page = f"http://127.0.0.1:{inst.port}/console/tasks?status=failed"
        sent = await client.post("/console/queues/default/pause", data={"csrf_token": token}, headers={"Referer": page})
        elsewhere = await client.post(
            "/console/queues/default/pause", data={"csrf_token": token}, headers={"Referer": "https://evil.example/x"}
        )
    assert (sent.status_code, sent.headers["location"]) == (
        303,
        "/console/sign-in?next=/console/tasks%3Fstatus%3Dfailed",
    )
    assert elsewhere.headers["location"] == "/console/sign-in?next=/console/overview"


async def test_a_sign_out_is_recorded_in_the_audit_log_with_its_key(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    made = await api_keys.create(stores.pg, "alice", ["tasks:read"], tenant_id="acme")
    async with start_instance(workers_enabled=False) as inst, client_of(inst) as client:
        token = await signed_in(client, made.key)
        out = await client.post("/console/sign-out", data={"csrf_token": token})
        after = await client.get("/console/queues")
    assert (out.status_code, out.headers["location"]) == (303, "/console/sign-in")
    assert after.status_code == 303  # the session is over
    rows = await pool.fetch(
        "SELECT action, actor_type, actor_id, actor_name, tenant_id, outcome FROM audit_events"
        " WHERE action LIKE 'console.%'"
    )
    assert sorted(tuple(r) for r in rows) == [
        ("console.sign_in", "key", made.record["key_id"], "alice", "acme", "ok"),
        ("console.sign_out", "key", made.record["key_id"], "alice", "acme", "ok"),
    ]
