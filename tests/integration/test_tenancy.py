"""Tenants that cannot see each other: every route, both ways.

Two tenants, ``acme`` and ``globex``, each with queued, completed and dead-lettered tasks,
a schedule, a bulk operation and a key. An ``acme`` key is walked over every ``/api/v1``
route of the OpenAPI document: on its own tenant's things it works; another tenant's task,
schedule, operation or key answers exactly as a missing one does (the same 404 body, the id
swapped), a search or a count for another tenant finds nothing, and a body naming another
tenant is refused (403 naming the field). Platform-wide views (queue depths, pausing a
queue, workers, metrics) are refused to a tenant key. Of the task limits, a tenant key sees only
those counted per tenant, and of each only its own tenant's counter; setting or unsetting one,
whose numbers hold for every tenant, is refused to it. A table below holds a check for every
route; a route added without one fails the walk.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from taskmesh.config import ScheduleSettings
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

TENANTS = ("acme", "globex")
MISSING = "00000000-0000-4000-8000-000000000000"
LIMITED = "limited"
"""The one queue the walk's instance works: its tasks hold the limits below, and wait on :data:`RELEASE`."""
LIMITS = {
    "per-tenant": {"queue": LIMITED, "key": "tenant_id", "concurrency": 1},
    "limited-queue": {"queue": LIMITED, "concurrency": 10},
}
"""One limit counted per tenant (a tenant key sees it, its own counter only), one over every tenant (it does not)."""


@pytest.fixture(autouse=True)
def handler(registry: Registry) -> anyio.Event:
    """The handlers the tasks and schedules name: ``report.build``'s queue is not worked here (nothing of it is
    executed); ``limit.hold`` holds its limits' slots until the event returned is set."""
    release = anyio.Event()

    @registry.task("report.build")
    async def build(payload: Any) -> None:
        return None

    @registry.task("limit.hold", queue=LIMITED)
    async def hold(payload: Any) -> None:
        await release.wait()

    return release


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions; DELETE FROM schedules")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class World:
    """What each tenant has: task ids by kind, its schedule, its operation, its key."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, str]] = {t: {} for t in TENANTS}
        self.operation: dict[str, str] = {}
        self.key: dict[str, str] = {}
        self.key_id: dict[str, str] = {}
        self.workflow: dict[str, dict[str, str]] = {t: {} for t in TENANTS}
        self.limited = False


async def seed(client: httpx.AsyncClient, pool: asyncpg.Pool, world: World) -> None:
    """Per tenant: queued (two), completed (two), dead-lettered (three) tasks and a bulk operation."""
    for tenant in TENANTS:
        kinds = ["queued", "queued2", "completed", "completed2", "failed", "failed2", "failed3"]
        for kind in kinds:
            made = await client.post(
                "/api/v1/tasks",
                json={"name": "report.build", "tenant_id": tenant, "payload": {"kind": kind}},
                headers=bearer(world.key["admin"]),
            )
            assert made.status_code == 201, made.text
            world.tasks[tenant][kind] = made.json()["task_id"]
        for kind, status in (("completed", "completed"), ("failed", "failed")):
            ids = [uuid.UUID(v) for k, v in world.tasks[tenant].items() if k.startswith(kind)]
            await pool.execute("UPDATE tasks SET status = $2 WHERE id = ANY($1::uuid[])", ids, status)
        op = await client.post(
            "/api/v1/tasks:bulk",
            json={"filter": {"tenant_id": tenant, "status": "cancelled"}, "action": "delete", "reason": "t"},
            headers=bearer(world.key[tenant]),
        )
        assert op.status_code == 202, op.text
        world.operation[tenant] = op.json()["operation_id"]
        for kind in ("running", "failed"):
            graph = {"name": f"{tenant}-{kind}", "tenant_id": tenant, "nodes": [{"id": "a", "task": "report.build"}]}
            made = await client.post("/api/v1/workflows", json=graph, headers=bearer(world.key["admin"]))
            assert made.status_code == 201, made.text
            world.workflow[tenant][kind] = made.json()["workflow_id"]
        failing = uuid.UUID(world.workflow[tenant]["failed"])
        await pool.execute("UPDATE tasks SET status = 'skipped' WHERE workflow_id = $1", failing)  # it ends failed


Check = Callable[[httpx.AsyncClient, World], Awaitable[None]]


async def same_as_missing(client: httpx.AsyncClient, method: str, path: str, other: str, key: str, **kw: Any) -> None:
    """``other`` (another tenant's id) answers exactly as an id nobody has."""
    seen = await client.request(method, path.format(id=other), headers=bearer(key), **kw)
    missing = await client.request(method, path.format(id=MISSING), headers=bearer(key), **kw)
    assert seen.status_code == missing.status_code == 404, (seen.text, missing.text)
    assert seen.text.replace(other, MISSING) == missing.text


async def create_task(c: httpx.AsyncClient, w: World) -> None:
    own = await c.post("/api/v1/tasks", json={"name": "report.build"}, headers=bearer(w.key["acme"]))
    assert own.status_code == 201, own.text
    got = await c.get(f"/api/v1/tasks/{own.json()['task_id']}", headers=bearer(w.key["acme"]))
    assert got.json()["task"]["tenant_id"] == "acme"  # filled in from the key
    other = await c.post(
        "/api/v1/tasks", json={"name": "report.build", "tenant_id": "globex"}, headers=bearer(w.key["acme"])
    )
    assert other.status_code == 403
    assert other.json()["errors"] == [
        {
            "field": "tenant_id",
            "message": "this key is bound to tenant 'acme'; it cannot create tasks of tenant 'globex'",
        }
    ]


async def create_batch(c: httpx.AsyncClient, w: World) -> None:
    own = await c.post(
        "/api/v1/tasks:batch",
        json={"tasks": [{"name": "report.build"}, {"name": "report.build", "tenant_id": "acme"}]},
        headers=bearer(w.key["acme"]),
    )
    assert (own.status_code, own.json()["created"]) == (200, 2), own.text
    other = await c.post(
        "/api/v1/tasks:batch",
        json={"tasks": [{"name": "report.build"}, {"name": "report.build", "tenant_id": "globex"}]},
        headers=bearer(w.key["acme"]),
    )
    assert (other.status_code, other.json()["errors"][0]["field"]) == (403, "tasks[1].tenant_id")


async def dedup_is_per_tenant(c: httpx.AsyncClient, w: World) -> None:
    body = {"name": "report.build", "dedup_key": "invoice-7"}
    theirs = await c.post("/api/v1/tasks", json=body, headers=bearer(w.key["globex"]))
    ours = await c.post("/api/v1/tasks", json=body, headers=bearer(w.key["acme"]))
    again = await c.post("/api/v1/tasks", json=body, headers=bearer(w.key["acme"]))
    assert (theirs.status_code, ours.status_code, again.status_code) == (201, 201, 200)
    assert ours.json()["task_id"] != theirs.json()["task_id"] and again.json()["task_id"] == ours.json()["task_id"]


async def get_task(c: httpx.AsyncClient, w: World) -> None:
    own = await c.get(f"/api/v1/tasks/{w.tasks['acme']['queued']}", headers=bearer(w.key["acme"]))
    assert own.status_code == 200
    await same_as_missing(c, "GET", "/api/v1/tasks/{id}", w.tasks["globex"]["queued"], w.key["acme"])
    await same_as_missing(c, "GET", "/api/v1/tasks/{id}?wait=1", w.tasks["globex"]["queued"], w.key["acme"])


async def get_runs(c: httpx.AsyncClient, w: World) -> None:
    own = await c.get(f"/api/v1/tasks/{w.tasks['acme']['queued']}/runs", headers=bearer(w.key["acme"]))
    assert own.status_code == 200 and len(own.json()["runs"]) == 1
    await same_as_missing(c, "GET", "/api/v1/tasks/{id}/runs", w.tasks["globex"]["queued"], w.key["acme"])


async def search(c: httpx.AsyncClient, w: World) -> None:
    own = await c.get("/api/v1/tasks?limit=500", headers=bearer(w.key["acme"]))
    assert own.status_code == 200
    assert {t["tenant_id"] for t in own.json()["tasks"]} == {"acme"}
    assert set(w.tasks["acme"].values()) <= {t["id"] for t in own.json()["tasks"]}
    for query in ("tenant_id=globex", "dedup_key=invoice-7&tenant_id=globex", "status=failed&tenant_id=globex"):
        other = await c.get(f"/api/v1/tasks?{query}", headers=bearer(w.key["acme"]))
        assert other.json() == {"tasks": [], "next_cursor": None, "partial": False}, query
    failed = await c.get("/api/v1/tasks?status=failed", headers=bearer(w.key["acme"]))
    assert {t["id"] for t in failed.json()["tasks"]} == {
        v for k, v in w.tasks["acme"].items() if k.startswith("failed")
    }


async def bulk(c: httpx.AsyncClient, w: World) -> None:
    dry = await c.post(
        "/api/v1/tasks:bulk",
        json={"filter": {"status": "failed"}, "action": "replay", "dry_run": True},
        headers=bearer(w.key["acme"]),
    )
    assert (dry.json()["matched"], set(dry.json()["sample"])) == (
        3,
        {v for k, v in w.tasks["acme"].items() if k.startswith("failed")},
    )
    other = await c.post(
        "/api/v1/tasks:bulk",
        json={"filter": {"tenant_id": "globex"}, "action": "delete", "dry_run": True},
        headers=bearer(w.key["acme"]),
    )
    assert other.json() == {"action": "delete", "matched": 0, "complete": True, "sample": []}


async def get_operation(c: httpx.AsyncClient, w: World) -> None:
    own = await c.get(f"/api/v1/operations/{w.operation['acme']}", headers=bearer(w.key["acme"]))
    assert (own.status_code, own.json()["tenant_id"]) == (200, "acme")
    await same_as_missing(c, "GET", "/api/v1/operations/{id}", w.operation["globex"], w.key["acme"])


async def cancel(c: httpx.AsyncClient, w: World) -> None:
    await same_as_missing(c, "POST", "/api/v1/tasks/{id}/cancel", w.tasks["globex"]["queued2"], w.key["acme"])
    theirs = await c.get(f"/api/v1/tasks/{w.tasks['globex']['queued2']}", headers=bearer(w.key["globex"]))
    assert theirs.json()["task"]["status"] == "queued"
    own = await c.post(f"/api/v1/tasks/{w.tasks['acme']['queued2']}/cancel", headers=bearer(w.key["acme"]))
    assert (own.status_code, own.json()["status"]) == (200, "cancelled")


async def retry(c: httpx.AsyncClient, w: World) -> None:
    await same_as_missing(c, "POST", "/api/v1/tasks/{id}/retry", w.tasks["globex"]["failed2"], w.key["acme"])
    own = await c.post(f"/api/v1/tasks/{w.tasks['acme']['failed2']}/retry", headers=bearer(w.key["acme"]))
    assert (own.status_code, own.json()["status"]) == (200, "queued")


async def delete(c: httpx.AsyncClient, w: World) -> None:
    why = {"reason": "tenant walk"}
    await same_as_missing(c, "DELETE", "/api/v1/tasks/{id}", w.tasks["globex"]["completed2"], w.key["acme"], params=why)
    own = await c.delete(f"/api/v1/tasks/{w.tasks['acme']['completed2']}", headers=bearer(w.key["acme"]), params=why)
    assert own.status_code == 204
    theirs = await c.get(f"/api/v1/tasks/{w.tasks['globex']['completed2']}", headers=bearer(w.key["globex"]))
    assert theirs.status_code == 200


async def create_workflow(c: httpx.AsyncClient, w: World) -> None:
    graph: dict[str, Any] = {"name": "own", "nodes": [{"id": "a", "task": "report.build"}]}
    own = await c.post("/api/v1/workflows", json=graph, headers=bearer(w.key["acme"]))
    assert own.status_code == 201, own.text
    got = await c.get(f"/api/v1/workflows/{own.json()['workflow_id']}", headers=bearer(w.key["acme"]))
    assert got.json()["tenant_id"] == "acme"  # filled in from the key
    other = await c.post("/api/v1/workflows", json={**graph, "tenant_id": "globex"}, headers=bearer(w.key["acme"]))
    assert other.status_code == 403
    assert other.json()["errors"] == [
        {
            "field": "tenant_id",
            "message": "this key is bound to tenant 'acme'; it cannot create workflows of tenant 'globex'",
        }
    ]


async def create_workflow_batch(c: httpx.AsyncClient, w: World) -> None:
    graph: dict[str, Any] = {"name": "own-batch", "nodes": [{"id": "a", "task": "report.build"}]}
    own = await c.post("/api/v1/workflows:batch", json={"workflows": [graph]}, headers=bearer(w.key["acme"]))
    assert own.status_code == 200 and own.json()["created"] == 1, own.text
    made = own.json()["results"][0]["workflow_id"]
    got = await c.get(f"/api/v1/workflows/{made}", headers=bearer(w.key["acme"]))
    assert got.json()["tenant_id"] == "acme"  # filled in from the key
    other = await c.post(
        "/api/v1/workflows:batch",
        json={"workflows": [graph, {**graph, "tenant_id": "globex"}]},
        headers=bearer(w.key["acme"]),
    )
    assert other.status_code == 403
    assert other.json()["errors"] == [
        {
            "field": "workflows[1].tenant_id",
            "message": "this key is bound to tenant 'acme'; it cannot create workflows of tenant 'globex'",
        }
    ]


async def get_workflow(c: httpx.AsyncClient, w: World) -> None:
    await same_as_missing(c, "GET", "/api/v1/workflows/{id}", w.workflow["globex"]["running"], w.key["acme"])
    own = await c.get(f"/api/v1/workflows/{w.workflow['acme']['running']}", headers=bearer(w.key["acme"]))
    assert own.status_code == 200


async def list_workflows(c: httpx.AsyncClient, w: World) -> None:
    mine = await c.get("/api/v1/workflows", headers=bearer(w.key["acme"]))
    assert mine.status_code == 200 and mine.json()["workflows"]
    assert {x["tenant_id"] for x in mine.json()["workflows"]} == {"acme"}
    theirs = await c.get("/api/v1/workflows", params={"tenant_id": "globex"}, headers=bearer(w.key["acme"]))
    assert theirs.json() == {"workflows": [], "next_cursor": None}
    everyone = await c.get("/api/v1/workflows", headers=bearer(w.key["admin"]))
    assert {x["tenant_id"] for x in everyone.json()["workflows"]} == {"acme", "globex"}


async def cancel_workflow(c: httpx.AsyncClient, w: World) -> None:
    path = "/api/v1/workflows/{id}/cancel"
    await same_as_missing(c, "POST", path, w.workflow["globex"]["running"], w.key["acme"])
    own = await c.post(path.format(id=w.workflow["acme"]["running"]), headers=bearer(w.key["acme"]))
    assert (own.status_code, own.json()["status"]) == (200, "cancelled")


async def retry_workflow(c: httpx.AsyncClient, w: World) -> None:
    path = "/api/v1/workflows/{id}/retry"
    await same_as_missing(c, "POST", path, w.workflow["globex"]["failed"], w.key["acme"])
    own = await c.post(path.format(id=w.workflow["acme"]["failed"]), headers=bearer(w.key["acme"]))
    assert (own.status_code, own.json()["status"]) == (200, "running")


def platform_wide(method: str, path: str, scope: str, what: str) -> Check:
    async def check(c: httpx.AsyncClient, w: World) -> None:
        refused = await c.request(method, path, headers=bearer(w.key["acme"]))
        assert refused.status_code == 403, refused.text
        assert refused.json()["detail"] == f"{what} covers every tenant; this key is bound to tenant 'acme'"
        assert refused.json()["scope"] == scope
        allowed = await c.request(method, path, headers=bearer(w.key["admin"]))
        assert allowed.status_code == 200, allowed.text

    return check


async def dlq(c: httpx.AsyncClient, w: World) -> None:
    own = await c.get("/api/v1/queues/default/dlq", headers=bearer(w.key["acme"]))
    assert {t["tenant_id"] for t in own.json()["tasks"]} == {"acme"}
    theirs = await c.get("/api/v1/queues/default/dlq", headers=bearer(w.key["globex"]))
    assert {t["tenant_id"] for t in theirs.json()["tasks"]} == {"globex"}


async def replay(c: httpx.AsyncClient, w: World) -> None:
    other_id = w.tasks["globex"]["failed3"]
    other = await c.post("/api/v1/queues/default/dlq/replay", json={"ids": [other_id]}, headers=bearer(w.key["acme"]))
    assert other.json() == {"queue": "default", "count": 0, "replayed": [], "not_replayed": [other_id]}
    oldest = await c.post("/api/v1/queues/default/dlq/replay", json={"count": 10}, headers=bearer(w.key["acme"]))
    assert set(oldest.json()["replayed"]) <= set(w.tasks["acme"].values()) and oldest.json()["count"] >= 1
    theirs = await c.get(f"/api/v1/tasks/{other_id}", headers=bearer(w.key["globex"]))
    assert theirs.json()["task"]["status"] == "failed"


async def schedules(c: httpx.AsyncClient, w: World) -> None:
    own = await c.get("/api/v1/schedules", headers=bearer(w.key["acme"]))
    assert [s["name"] for s in own.json()["schedules"]] == ["acme-nightly"]
    assert own.json()["schedules"][0]["tenant_id"] == "acme"


def schedule_route(method: str, suffix: str, status: int) -> Check:
    async def check(c: httpx.AsyncClient, w: World) -> None:
        own = await c.request(method, f"/api/v1/schedules/acme-nightly{suffix}", headers=bearer(w.key["acme"]))
        assert own.status_code == status, own.text
        if suffix == "/trigger":
            made = await c.get(f"/api/v1/tasks/{own.json()['task_id']}", headers=bearer(w.key["acme"]))
            assert made.json()["task"]["tenant_id"] == "acme"
        other = await c.request(method, f"/api/v1/schedules/globex-nightly{suffix}", headers=bearer(w.key["acme"]))
        nobody = await c.request(method, f"/api/v1/schedules/nobody-nightly{suffix}", headers=bearer(w.key["acme"]))
        assert other.status_code == nobody.status_code == 404
        assert other.text.replace("globex", "nobody") == nobody.text

    return check


async def list_keys(c: httpx.AsyncClient, w: World) -> None:
    own = await c.get("/api/v1/keys", headers=bearer(w.key["acme"]))
    assert {(k["name"], k["tenant_id"]) for k in own.json()["keys"]} == {
        ("acme-admin", "acme"),
        ("acme-reader-admin", "acme"),
    }


async def create_key(c: httpx.AsyncClient, w: World) -> None:
    own = await c.post("/api/v1/keys", json={"name": "acme-ci", "role": "viewer"}, headers=bearer(w.key["acme"]))
    assert (own.status_code, own.json()["tenant_id"]) == (201, "acme"), own.text
    other = await c.post(
        "/api/v1/keys", json={"name": "x", "role": "viewer", "tenant_id": "globex"}, headers=bearer(w.key["acme"])
    )
    assert (other.status_code, other.json()["errors"][0]["field"]) == (403, "tenant_id")
    narrow = await c.post(
        "/api/v1/keys", json={"name": "x", "scopes": ["tasks:read"]}, headers=bearer(w.key["acme-reader-admin"])
    )
    wider = await c.post(
        "/api/v1/keys", json={"name": "x", "scopes": ["tasks:write"]}, headers=bearer(w.key["acme-reader-admin"])
    )
    assert narrow.status_code == 201
    assert (wider.status_code, wider.json()["detail"]) == (
        403,
        "this key cannot give scopes it does not hold: tasks:write",
    )


def key_route(suffix: str, status: int) -> Check:
    async def check(c: httpx.AsyncClient, w: World) -> None:
        other = await c.post(f"/api/v1/keys/{w.key_id['globex']}{suffix}", headers=bearer(w.key["acme"]))
        nobody = await c.post(f"/api/v1/keys/aaaaaaaaaaaaaaaa{suffix}", headers=bearer(w.key["acme"]))
        assert other.status_code == nobody.status_code == 404
        assert other.text.replace(w.key_id["globex"], "aaaaaaaaaaaaaaaa") == nobody.text
        made = await c.post("/api/v1/keys", json={"name": "acme-tmp", "role": "viewer"}, headers=bearer(w.key["acme"]))
        own = await c.post(f"/api/v1/keys/{made.json()['key_id']}{suffix}", headers=bearer(w.key["acme"]))
        assert own.status_code == status, own.text
        assert own.json()["tenant_id"] == "acme"  # a rotated key keeps its tenant

    return check


async def audit_log(c: httpx.AsyncClient, w: World) -> None:
    own = await c.get("/api/v1/audit?limit=500", headers=bearer(w.key["acme"]))
    assert own.status_code == 200 and own.json()["events"], own.text
    assert {e["tenant_id"] for e in own.json()["events"]} == {"acme"}
    everyone = await c.get("/api/v1/audit?limit=500", headers=bearer(w.key["admin"]))
    assert {"acme", "globex"} <= {e["tenant_id"] for e in everyone.json()["events"]}
    other = await c.get("/api/v1/audit?tenant_id=globex", headers=bearer(w.key["acme"]))
    assert other.json() == {"events": [], "next_cursor": None}


async def hold_limits(c: httpx.AsyncClient, w: World) -> None:
    """Once: per tenant, one ``limit.hold`` running and one waiting for its tenant's slot of ``per-tenant``."""
    if w.limited:
        return
    waiting = []
    for tenant in TENANTS:
        for _ in range(2):
            made = await c.post("/api/v1/tasks", json={"name": "limit.hold"}, headers=bearer(w.key[tenant]))
            assert made.status_code == 201, made.text
            waiting.append((tenant, made.json()["task_id"]))

    async def parked() -> bool:
        found = 0
        for tenant, task_id in waiting:
            got = await c.get(f"/api/v1/tasks/{task_id}", headers=bearer(w.key[tenant]))
            found += any(b["reason"] == "limit" for b in got.json()["task"]["blocked_by"] or [])
        return found == len(TENANTS)

    await wait_for(parked)
    w.limited = True


def own_counter(tenant: str) -> list[dict[str, Any]]:
    """The usage of ``per-tenant`` a key of ``tenant`` sees: its own counter, one run in, one task waiting."""
    key = f"per-tenant:{tenant}"
    return [{"queue": LIMITED, "key": key, "in_use": 1, "waiting": 1, "backing_off_until_ms": None}]


async def list_limits(c: httpx.AsyncClient, w: World) -> None:
    await hold_limits(c, w)
    for tenant in TENANTS:
        own = await c.get("/api/v1/limits", headers=bearer(w.key[tenant]))
        assert own.status_code == 200, own.text
        assert [(x["name"], x["usage"]) for x in own.json()["limits"]] == [("per-tenant", own_counter(tenant))]
    everyone = (await c.get("/api/v1/limits", headers=bearer(w.key["admin"]))).json()["limits"]
    assert [x["name"] for x in everyone] == ["limited-queue", "per-tenant"]
    assert [(u["key"], u["waiting"]) for u in everyone[1]["usage"]] == [
        ("per-tenant:acme", 1),
        ("per-tenant:globex", 1),
    ]


async def get_limit(c: httpx.AsyncClient, w: World) -> None:
    await hold_limits(c, w)
    own = await c.get("/api/v1/limits/per-tenant", headers=bearer(w.key["acme"]))
    assert (own.status_code, own.json()["usage"]) == (200, own_counter("acme")), own.text
    # A limit over every tenant answers a tenant key as a limit nobody has.
    await same_as_missing(c, "GET", "/api/v1/limits/{id}", "limited-queue", w.key["acme"])
    admin = await c.get("/api/v1/limits/limited-queue", headers=bearer(w.key["admin"]))
    assert (admin.status_code, admin.json()["usage"][0]["in_use"]) == (200, 2), admin.text


def change_limit(method: str, status: int) -> Check:
    async def check(c: httpx.AsyncClient, w: World) -> None:
        body = {"queue": LIMITED, "key": "tenant_id", "concurrency": 2} if method == "PUT" else None
        what = "setting a limit" if method == "PUT" else "changing this limit"
        for tenant in TENANTS:
            refused = await c.request(method, "/api/v1/limits/per-tenant", json=body, headers=bearer(w.key[tenant]))
            assert refused.status_code == 403, refused.text
            assert refused.json()["detail"] == f"{what} covers every tenant; this key is bound to tenant {tenant!r}"
            assert refused.json()["scope"] == "queues:admin"
        allowed = await c.request(method, "/api/v1/limits/per-tenant", json=body, headers=bearer(w.key["admin"]))
        assert allowed.status_code == status, allowed.text
        got = await c.get("/api/v1/limits/per-tenant", headers=bearer(w.key["acme"]))
        assert got.json()["concurrency"] == (2 if method == "PUT" else 1)

    return check


ROUTES: dict[tuple[str, str], list[Check]] = {
    ("POST", "/api/v1/tasks"): [create_task, dedup_is_per_tenant],
    ("POST", "/api/v1/tasks:batch"): [create_batch],
    ("GET", "/api/v1/tasks/{task_id}"): [get_task],
    ("GET", "/api/v1/tasks/{task_id}/runs"): [get_runs],
    ("GET", "/api/v1/tasks"): [search],
    ("POST", "/api/v1/tasks:bulk"): [bulk],
    ("GET", "/api/v1/operations/{operation_id}"): [get_operation],
    ("POST", "/api/v1/tasks/{task_id}/cancel"): [cancel],
    ("POST", "/api/v1/tasks/{task_id}/retry"): [retry],
    ("DELETE", "/api/v1/tasks/{task_id}"): [delete],
    ("POST", "/api/v1/workflows"): [create_workflow],
    ("POST", "/api/v1/workflows:batch"): [create_workflow_batch],
    ("GET", "/api/v1/workflows/{workflow_id}"): [get_workflow],
    ("GET", "/api/v1/workflows"): [list_workflows],
    ("POST", "/api/v1/workflows/{workflow_id}/cancel"): [cancel_workflow],
    ("POST", "/api/v1/workflows/{workflow_id}/retry"): [retry_workflow],
    ("GET", "/api/v1/queues"): [platform_wide("GET", "/api/v1/queues", "tasks:read", "the queue list")],
    ("GET", "/api/v1/history"): [
        platform_wide("GET", "/api/v1/history", "tasks:read", "the queues' history"),
        platform_wide("GET", "/api/v1/history?queue=default&window=day", "tasks:read", "the queues' history"),
    ],
    ("GET", "/api/v1/queues/{queue}"): [
        platform_wide("GET", "/api/v1/queues/default", "tasks:read", "a queue's overview")
    ],
    ("POST", "/api/v1/queues/{queue}/pause"): [
        platform_wide("POST", "/api/v1/queues/default/pause", "queues:admin", "pausing a queue")
    ],
    ("POST", "/api/v1/queues/{queue}/resume"): [
        platform_wide("POST", "/api/v1/queues/default/resume", "queues:admin", "resuming a queue")
    ],
    ("GET", "/api/v1/queues/{queue}/dlq"): [dlq],
    ("POST", "/api/v1/queues/{queue}/dlq/replay"): [replay],
    ("GET", "/api/v1/schedules"): [schedules],
    ("GET", "/api/v1/schedules/{name}"): [schedule_route("GET", "", 200)],
    ("POST", "/api/v1/schedules/{name}/trigger"): [schedule_route("POST", "/trigger", 201)],
    ("POST", "/api/v1/schedules/{name}/pause"): [schedule_route("POST", "/pause", 200)],
    ("POST", "/api/v1/schedules/{name}/resume"): [schedule_route("POST", "/resume", 200)],
    ("GET", "/api/v1/workers"): [platform_wide("GET", "/api/v1/workers", "workers:read", "the workers' list")],
    ("GET", "/api/v1/keys"): [list_keys],
    ("POST", "/api/v1/keys"): [create_key],
    ("POST", "/api/v1/keys/{key_id}/revoke"): [key_route("/revoke", 200)],
    ("POST", "/api/v1/keys/{key_id}/rotate"): [key_route("/rotate", 201)],
    ("GET", "/api/v1/audit"): [audit_log],
    ("GET", "/api/v1/limits"): [list_limits],
    ("GET", "/api/v1/limits/{limit}"): [get_limit],
    ("PUT", "/api/v1/limits/{limit}"): [change_limit("PUT", 200)],
    ("DELETE", "/api/v1/limits/{limit}"): [change_limit("DELETE", 204)],
}
"""A check of each route, both ways; the walk fails for a route of the document not listed here."""


async def test_a_tenant_key_sees_and_acts_on_its_own_tenant_only_on_every_route(
    start_instance: Any, stores: Any, pool: asyncpg.Pool, handler: anyio.Event
) -> None:
    world = World()
    world.key["admin"] = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    for tenant in TENANTS:
        new = await api_keys.create(stores.pg, f"{tenant}-admin", list(SCOPES), tenant_id=tenant)
        world.key[tenant], world.key_id[tenant] = new.key, new.record["key_id"]
    world.key["acme-reader-admin"] = (
        await api_keys.create(stores.pg, "acme-reader-admin", ["tasks:read", "keys:admin"], tenant_id="acme")
    ).key
    nightly = [
        ScheduleSettings(name=f"{t}-nightly", cron="0 3 * * *", task="report.build", tenant_id=t) for t in TENANTS
    ]
    # The walk makes more admin calls per second than the default budget of 10.
    settings = {"rate_limit_admin_per_second": 1000.0, "queue_names": [LIMITED], "worker_concurrency": 8}
    async with start_instance(schedules=nightly, limits=LIMITS, **settings) as inst, http(inst) as client:
        await seed(client, pool, world)
        documented = {
            (method.upper(), path)
            for path, operations in (await client.get("/openapi.json")).json()["paths"].items()
            if path.startswith("/api/v1/")
            for method in operations
        }
        assert documented == set(ROUTES), f"routes without a tenancy check: {documented - set(ROUTES)}"
        try:
            for route, checks in ROUTES.items():
                for check in checks:
                    try:
                        await check(client, world)
                    except AssertionError as exc:
                        raise AssertionError(f"{route}: {check.__qualname__}: {exc}") from exc
        finally:
            handler.set()  # the held runs end before the instance stops


async def test_a_bulk_action_of_a_tenant_key_acts_on_its_tenant_only(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    acme = (await api_keys.create(stores.pg, "acme", list(SCOPES), tenant_id="acme")).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        made = {}
        for tenant in TENANTS:
            answer = await client.post(
                "/api/v1/tasks:batch",
                json={"tasks": [{"name": "report.build", "tenant_id": tenant}] * 3},
                headers=bearer(admin),
            )
            made[tenant] = [uuid.UUID(r["task_id"]) for r in answer.json()["results"]]
        await pool.execute("UPDATE tasks SET status = 'failed'")
        # A filter naming no tenant: the key's own is added.
        op = await client.post(
            "/api/v1/tasks:bulk",
            json={"filter": {"status": "failed"}, "action": "replay", "reason": "t"},
            headers=bearer(acme),
        )
        assert op.status_code == 202, op.text

        async def finished() -> Any:
            got = await client.get(f"/api/v1/operations/{op.json()['operation_id']}", headers=bearer(acme))
            return got.json() if got.json()["status"] != "running" else None

        done = await wait_for(finished, timeout=15)
    assert (done["status"], done["done"], done["tenant_id"]) == ("done", 3, "acme")
    rows = await pool.fetch("SELECT tenant_id, status FROM tasks")
    assert sorted((r["tenant_id"], r["status"]) for r in rows) == [("acme", "queued")] * 3 + [("globex", "failed")] * 3


async def test_a_key_bound_to_queues_sees_and_uses_those_queues_only(start_instance: Any, stores: Any) -> None:
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    reports = (await api_keys.create(stores.pg, "reports", list(SCOPES), queues=["reports"])).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        mine = await client.post(
            "/api/v1/tasks", json={"name": "report.build", "queue_name": "reports"}, headers=bearer(reports)
        )
        other = await client.post("/api/v1/tasks", json={"name": "report.build"}, headers=bearer(admin))
        refused = await client.post("/api/v1/tasks", json={"name": "report.build"}, headers=bearer(reports))
        found = await client.get("/api/v1/tasks", headers=bearer(reports))
        hidden = await client.get(f"/api/v1/tasks/{other.json()['task_id']}", headers=bearer(reports))
        queues = await client.get("/api/v1/queues", headers=bearer(reports))
        default = await client.get("/api/v1/queues/default", headers=bearer(reports))
        workers = await client.get("/api/v1/workers", headers=bearer(reports))
        moved = await client.post(
            f"/api/v1/tasks/{mine.json()['task_id']}/retry", json={"queue_name": "default"}, headers=bearer(reports)
        )
    assert mine.status_code == 201 and other.status_code == 201
    assert (refused.status_code, refused.json()["errors"]) == (
        403,
        [{"field": "queue_name", "message": "this key may use the queues reports; not 'default'"}],
    )
    assert [t["id"] for t in found.json()["tasks"]] == [mine.json()["task_id"]]
    assert hidden.status_code == 404
    assert [q["queue"] for q in queues.json()["queues"]] == ["reports"]
    assert (default.status_code, default.json()["errors"][0]["field"]) == (403, "queue")
    assert (workers.status_code, workers.json()["detail"]) == (
        403,
        "the workers' list covers every queue; this key is bound to some queues",
    )
    assert (moved.status_code, moved.json()["errors"][0]["field"]) == (403, "queue_name")
