"""API keys and scopes: who may call which route, and when an instance runs open.

Keys are made with the CLI against the real database (as an operator makes the first one),
then used against real instances. Every ``/api/v1`` route is walked from the OpenAPI
document: each names its scope, refuses a request without a key (401) and a key without
its scope (403).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from taskmesh.errors import ConfigError
from taskmesh.runtime import supervisor
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.store import PgStore
from tests.cli_support import env, run_cli
from tests.conftest import http, wait_for
from tests.proc import ROOT, free_port

pytestmark = pytest.mark.anyio

UNAUTHORIZED = "an API key is required: Authorization: Bearer tmk_<id>_<secret>"
DUMMY = {
    "task_id": "00000000-0000-4000-8000-000000000000",
    "operation_id": "00000000-0000-4000-8000-000000000000",
    "queue": "default",
    "name": "nightly",
    "key_id": "aaaaaaaaaaaaaaaa",
    "workflow_id": "00000000-0000-4000-8000-000000000000",
    "limit": "per-customer",
}


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions")


async def make_key(pg: PgStore, name: str, *scopes: str, **kwargs: Any) -> str:
    return (await api_keys.create(pg, name, list(scopes), **kwargs)).key


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_the_cli_makes_the_first_key_which_closes_a_loopback_instance_that_ran_open(
    start_instance: Any, database_url: str, pool: asyncpg.Pool
) -> None:
    async with start_instance() as inst, http(inst) as client:
        assert inst.state is not None
        inst.state.keys.ttl = 0.2
        assert (await client.get("/api/v1/workers")).status_code == 200  # open: no key exists yet

        made = await anyio.to_thread.run_sync(
            lambda: run_cli(
                "keys", "create", "--name", "admin", "--role", "admin", environ=env(DATABASE_URL=database_url)
            )
        )
        assert made.code == 0, made.err
        key = made.out.strip()
        assert re.fullmatch(r"tmk_[a-z2-7]{16}_[0-9a-f]{48}", key)
        assert made.err.startswith(f"key {key[4:20]} for admin: tasks:read, tasks:write")
        stored = await pool.fetchrow("SELECT name, secret_hash, scopes FROM api_keys")
        assert (
            stored is not None and stored["name"] == "admin" and key[21:].encode() not in bytes(stored["secret_hash"])
        )

        async def closed() -> bool:
            return (await client.get("/api/v1/workers")).status_code == 401

        await wait_for(closed, timeout=5)
        anonymous = await client.get("/api/v1/workers")
        assert anonymous.json() == {
            "type": "about:blank",
            "title": "Unauthorized",
            "status": 401,
            "detail": UNAUTHORIZED,
        }
        assert anonymous.headers["www-authenticate"] == 'Bearer realm="taskmesh"'
        assert (await client.get("/api/v1/workers", headers=bearer(key))).status_code == 200
        assert (await client.get("/api/v1/workers", headers={"X-API-Key": key})).status_code == 200
        wrong = key[:-1] + ("0" if key[-1] != "0" else "1")
        refused = await client.get("/api/v1/workers", headers=bearer(wrong))
        assert (refused.status_code, refused.json()["detail"]) == (401, f"no valid key has id {key[4:20]}")
        malformed = await client.get("/api/v1/workers", headers=bearer("hunter2"))
        assert malformed.json()["detail"] == "the API key is not of the form tmk_<id>_<secret>"
        assert (await client.get("/healthz")).status_code == 200 and (await client.get("/readyz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200  # metrics_auth = "open" by default

        listed = await anyio.to_thread.run_sync(
            lambda: run_cli("keys", "list", "--json", environ=env(DATABASE_URL=database_url))
        )
        [row] = listed.json()["keys"]
        assert (row["key_id"], row["state"], row["last_used_at"] is not None) == (key[4:20], "active", True)
        assert "secret_hash" not in row and key not in listed.out


async def test_every_api_route_names_its_scope_and_refuses_no_key_with_401_and_a_key_without_it_with_403(
    start_instance: Any, stores: Any
) -> None:
    await make_key(stores.pg, "admin", *SCOPES)
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        spec = (await client.get("/openapi.json")).json()
        checked = []
        for path, operations in spec["paths"].items():
            if not path.startswith("/api/v1/"):
                continue
            url = path.format(**DUMMY)
            for method, operation in operations.items():
                scope = operation.get("x-required-scope")
                assert scope in SCOPES, f"{method.upper()} {path} names no scope"
                others = [s for s in SCOPES if s != scope]
                lacking = await make_key(stores.pg, f"without-{scope}", *others)
                body: dict[str, Any] | None = {} if method == "post" else None
                anonymous = await client.request(method, url, json=body)
                assert anonymous.status_code == 401, f"{method.upper()} {path}: {anonymous.text}"
                denied = await client.request(method, url, json=body, headers=bearer(lacking))
                assert denied.status_code == 403, f"{method.upper()} {path}: {denied.text}"
                assert denied.json() == {
                    "type": "about:blank",
                    "title": "Forbidden",
                    "status": 403,
                    "detail": f"this key lacks the scope {scope!r}",
                    "scope": scope,
                }
                checked.append((method.upper(), path, scope))
    assert len(checked) == 38
    assert ("POST", "/api/v1/queues/{queue}/pause", "queues:admin") in checked
    assert ("GET", "/api/v1/limits", "tasks:read") in checked
    assert ("PUT", "/api/v1/limits/{limit}", "queues:admin") in checked
    assert ("DELETE", "/api/v1/limits/{limit}", "queues:admin") in checked
    assert ("GET", "/api/v1/workers", "workers:read") in checked


async def test_a_bulk_action_needs_the_scope_of_its_action_and_counting_needs_only_tasks_read(
    start_instance: Any, stores: Any
) -> None:
    reader = await make_key(stores.pg, "reader", "tasks:read")
    replayer = await make_key(stores.pg, "replayer", "tasks:read", "dlq:replay")
    body = {"filter": {"status": ["failed"]}, "action": "replay", "reason": "test"}
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        dry = await client.post("/api/v1/tasks:bulk", json={**body, "dry_run": True}, headers=bearer(reader))
        real = await client.post("/api/v1/tasks:bulk", json=body, headers=bearer(reader))
        allowed = await client.post("/api/v1/tasks:bulk", json=body, headers=bearer(replayer))
    assert dry.status_code == 200
    assert (real.status_code, real.json()["scope"]) == (403, "dlq:replay")
    assert allowed.status_code == 202


async def test_a_revoked_key_stops_working_on_every_instance_within_5_seconds(
    start_instance: Any, stores: Any, database_url: str
) -> None:
    key = await make_key(stores.pg, "ci", "tasks:read", "workers:read")
    async with start_instance() as first, start_instance(workers_enabled=False) as second:
        async with http(first) as one, http(second) as two:
            for client in (one, two):
                assert (await client.get("/api/v1/workers", headers=bearer(key))).status_code == 200
            revoked = await anyio.to_thread.run_sync(
                lambda: run_cli("keys", "revoke", key[4:20], environ=env(DATABASE_URL=database_url))
            )
            assert (revoked.code, revoked.out) == (0, f"{key[4:20]}: revoked\n"), revoked.err
            t0 = time.monotonic()

            async def refused_by_both() -> bool:
                codes = [(await c.get("/api/v1/workers", headers=bearer(key))).status_code for c in (one, two)]
                return codes == [401, 401]

            await wait_for(refused_by_both, timeout=6, interval=0.1)
            assert time.monotonic() - t0 <= 5.5
            answer = (await one.get("/api/v1/workers", headers=bearer(key))).json()
    assert answer["detail"] == f"the key {key[4:20]} was revoked"


async def test_a_rotated_key_overlaps_the_old_one_and_an_expired_key_is_refused(
    start_instance: Any, stores: Any, database_url: str
) -> None:
    old = await make_key(stores.pg, "deployer", "tasks:read")
    rotated = await anyio.to_thread.run_sync(
        lambda: run_cli(
            "keys", "rotate", old[4:20], "--overlap", "6s", "--json", environ=env(DATABASE_URL=database_url)
        )
    )
    assert rotated.code == 0, rotated.err
    new = rotated.json()["key"]
    assert (rotated.json()["name"], rotated.json()["scopes"], rotated.json()["replaces"]) == (
        "deployer",
        ["tasks:read"],
        old[4:20],
    )
    assert rotated.json()["expires_at"] is None and rotated.json()["replaced_key_expires_at"] is not None
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        assert inst.state is not None
        inst.state.keys.ttl = 0.1
        assert (await client.get("/api/v1/tasks", headers=bearer(old))).status_code == 200
        assert (await client.get("/api/v1/tasks", headers=bearer(new))).status_code == 200
        # until the overlap ends (6 s from the rotation: time enough for a loaded machine to start the instance)
        ends = datetime.fromisoformat(rotated.json()["replaced_key_expires_at"])
        await anyio.sleep(max(0.0, (ends - datetime.now(UTC)).total_seconds()) + 0.2)
        expired = await client.get("/api/v1/tasks", headers=bearer(old))
        assert (expired.status_code, expired.json()["detail"]) == (401, f"the key {old[4:20]} expired")
        assert (await client.get("/api/v1/tasks", headers=bearer(new))).status_code == 200
    again = await anyio.to_thread.run_sync(
        lambda: run_cli("keys", "rotate", old[4:20], environ=env(DATABASE_URL=database_url))
    )
    assert (again.code, again.err) == (
        3,
        f"taskmesh: error: no active key has id {old[4:20]} (revoked, expired or unknown)\n",
    )


async def test_metrics_behind_a_scope_when_configured(start_instance: Any, stores: Any) -> None:
    key = await make_key(stores.pg, "prometheus", "metrics:read")
    async with start_instance(workers_enabled=False, metrics_auth="scope") as inst, http(inst) as client:
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers=bearer(key))).status_code == 200
        assert (await client.get("/healthz")).status_code == 200


async def test_the_cli_sends_its_key_and_says_when_one_is_missing(start_instance: Any, stores: Any) -> None:
    key = await make_key(stores.pg, "ops", "tasks:read", "workers:read")
    async with start_instance(workers_enabled=False) as inst:
        url = f"http://127.0.0.1:{inst.port}"

        def cli(*args: str, **extra: str) -> Any:
            return run_cli(*args, "--url", url, environ=env(**extra))

        without = await anyio.to_thread.run_sync(lambda: cli("workers"))
        with_env = await anyio.to_thread.run_sync(lambda: cli("workers", TASKMESH_API_KEY=key))
        with_flag = await anyio.to_thread.run_sync(lambda: run_cli("--api-key", key, "workers", "--url", url))
        no_scope = await anyio.to_thread.run_sync(lambda: cli("queues", "pause", "default", TASKMESH_API_KEY=key))
    assert (without.code, without.err) == (
        1,
        f"taskmesh: error: Unauthorized: {UNAUTHORIZED} "
        "(give the key in TASKMESH_API_KEY or with taskmesh --api-key)\n",
    )
    assert (with_env.code, with_flag.code) == (0, 0)
    assert (no_scope.code, no_scope.err) == (1, "taskmesh: error: Forbidden: this key lacks the scope 'queues:admin'\n")


async def test_an_api_instance_for_other_hosts_will_not_start_without_a_key(database_url: str, redis_url: str) -> None:
    # The pool fixture (through no_keys_left) emptied api_keys first.
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-m", "taskmesh", "run"],
            env=env(
                DATABASE_URL=database_url,
                REDIS_URL=redis_url,
                TASKMESH_REDIS_PREFIX=f"auth-{free_port()}",
                HTTP_HOST="0.0.0.0",
                HTTP_PORT="0",
                TASKMESH_MIGRATE_ON_START="false",
                TASKMESH_LOG_LEVEL="warning",
            ),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == (
        "taskmesh: error: auth: the API listens on 0.0.0.0, which is not a loopback address, and no active API key "
        "exists: make one with `taskmesh keys create --name admin --role admin` (it talks to DATABASE_URL "
        'directly), or set auth = "none" (TASKMESH_AUTH=none) to serve without keys'
    )


async def test_keys_are_managed_over_the_api_with_keys_admin(start_instance: Any, stores: Any) -> None:
    admin = await make_key(stores.pg, "admin", *SCOPES)
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        assert inst.state is not None
        inst.state.keys.ttl = 0.1
        made = await client.post(
            "/api/v1/keys",
            json={"name": "grafana", "role": "viewer", "expires_in_seconds": 3600},
            headers=bearer(admin),
        )
        assert made.status_code == 201, made.text
        viewer = made.json()["key"]
        assert (made.json()["scopes"], made.json()["state"]) == (["tasks:read", "workers:read"], "active")
        assert (await client.get("/api/v1/workers", headers=bearer(viewer))).status_code == 200
        listed = (await client.get("/api/v1/keys", headers=bearer(admin))).json()["keys"]
        assert {k["name"] for k in listed} == {"admin", "grafana"}
        assert all("key" not in k and "secret_hash" not in k for k in listed)
        rotated = await client.post(
            f"/api/v1/keys/{viewer[4:20]}/rotate", json={"overlap_seconds": 0}, headers=bearer(admin)
        )
        assert (rotated.status_code, rotated.json()["replaces"]) == (201, viewer[4:20])
        successor = rotated.json()["key"]
        revoked = await client.post(f"/api/v1/keys/{successor[4:20]}/revoke", headers=bearer(admin))
        assert (revoked.status_code, revoked.json()["state"]) == (200, "revoked")
        await anyio.sleep(0.2)
        for gone in (viewer, successor):
            assert (await client.get("/api/v1/workers", headers=bearer(gone))).status_code == 401
        bad_scope = await client.post("/api/v1/keys", json={"name": "x", "scopes": ["root"]}, headers=bearer(admin))
        unknown = await client.post("/api/v1/keys/aaaaaaaaaaaaaaaa/revoke", headers=bearer(admin))
        malformed = await client.post("/api/v1/keys/nope/revoke", headers=bearer(admin))
        no_admin = await client.get("/api/v1/keys", headers=bearer(viewer))
    assert (bad_scope.status_code, bad_scope.json()["detail"]) == (
        422,
        f"scopes: unknown scope 'root'; known: {', '.join(SCOPES)}",
    )
    assert (unknown.status_code, unknown.json()["detail"]) == (404, "no key has id aaaaaaaaaaaaaaaa")
    assert (malformed.status_code, malformed.json()["detail"]) == (
        422,
        "key_id: must be the 16 characters of a key's id (a-z, 2-7)",
    )
    assert no_admin.status_code == 401  # revoked by now; a live key without keys:admin gets 403 (the walk above)


async def test_metrics_on_a_port_of_their_own_leave_the_apis_port(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False, metrics_port=0) as inst, http(inst) as client:
        assert inst.metrics_port is not None and inst.metrics_port != inst.port
        on_api = await client.get("/metrics")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{inst.metrics_port}", timeout=10) as scraper:
            scraped = await scraper.get("/metrics")
            probe = await scraper.get("/readyz")
            no_api = await scraper.get("/api/v1/tasks")
        api_probe = await client.get("/healthz")
    assert on_api.status_code == 404
    assert scraped.status_code == 200 and "taskmesh_build_info" in scraped.text
    assert scraped.headers["content-type"].startswith("text/plain")
    assert (probe.status_code, no_api.status_code, api_probe.status_code) == (200, 404, 200)


async def test_a_metrics_port_in_use_stops_the_start_naming_metrics_port(
    start_instance: Any, make_settings: Any, registry: Any
) -> None:
    async with start_instance(workers_enabled=False) as first:
        with pytest.raises(ConfigError) as caught:
            await supervisor.run(make_settings(workers_enabled=False, metrics_port=first.port), registry, signals=False)
    assert str(caught.value) == f"metrics_port: cannot listen on 127.0.0.1:{first.port}: Address already in use"
