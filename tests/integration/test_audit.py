"""The audit log: every change and every refused call, who made it, how it ended; written
in the change's own transaction; read back with filters and keyset pages; append-only; a month at a
time dropped by retention."""

from __future__ import annotations

import getpass
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.services import retention
from tests.cli_support import env, run_cli
from tests.conftest import empty_audit_log, http

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions; DROP TABLE IF EXISTS audit_events_202401")
    await empty_audit_log(pool)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def events(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    return [dict(r) for r in await pool.fetch("SELECT * FROM audit_events ORDER BY at, id")]


async def test_changes_and_refusals_are_recorded_with_actor_action_resource_and_outcome(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    admin = await api_keys.create(stores.pg, "ops", list(SCOPES))
    reader = await api_keys.create(stores.pg, "grafana", ["tasks:read"])
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        made = await client.post(
            "/api/v1/tasks",
            json={"name": "x", "tenant_id": "acme"},
            headers={**bearer(admin.key), "User-Agent": "deploy-bot/1", "X-Request-ID": "req-42"},
        )
        task_id = made.json()["task_id"]
        await client.post(f"/api/v1/tasks/{task_id}/cancel", headers=bearer(admin.key))
        again = await client.post(f"/api/v1/tasks/{task_id}/cancel", headers=bearer(admin.key))
        no_why = await client.delete(f"/api/v1/tasks/{task_id}", headers=bearer(admin.key))
        why = {"reason": "GDPR erasure 118"}
        gone = await client.delete(f"/api/v1/tasks/{task_id}", params=why, headers=bearer(admin.key))
        await client.post("/api/v1/queues/reports/pause", json={"reason": "db upgrade"}, headers=bearer(admin.key))
        forbidden = await client.post("/api/v1/queues/reports/resume", headers=bearer(reader.key))
        nobody = await client.get("/api/v1/workers")
        wrong = await client.get("/api/v1/tasks", headers=bearer(admin.key[:-4] + "0000"))
        await client.get("/api/v1/tasks", headers=bearer(admin.key))  # a read let through: not recorded
        dry = await client.post(
            "/api/v1/tasks:bulk",
            json={"filter": {"status": "failed"}, "action": "replay", "dry_run": True},
            headers=bearer(admin.key),
        )
        bulk = await client.post(
            "/api/v1/tasks:bulk",
            json={"filter": {"status": "failed"}, "action": "replay", "reason": "fixed the bug"},
            headers=bearer(admin.key),
        )
    assert (again.status_code, forbidden.status_code, nobody.status_code, wrong.status_code) == (409, 403, 401, 401)
    assert dry.status_code == 200 and bulk.status_code == 202
    assert (no_why.status_code, gone.status_code) == (422, 204)
    seen = [
        (e["actor_type"], e["actor_id"], e["action"], e["resource_type"], e["resource_id"], e["outcome"], e["status"])
        for e in await events(pool)
    ]
    key, reader_id = admin.record["key_id"], reader.record["key_id"]
    operation = bulk.json()["operation_id"]
    assert seen == [
        ("key", key, "task.create", "task", task_id, "ok", None),  # in the change's own transaction
        ("key", key, "task.cancel", "task", task_id, "ok", None),
        ("key", key, "task.cancel", "task", task_id, "error", 409),
        ("key", key, "task.delete", "task", task_id, "error", 422),
        ("key", key, "task.delete", "task", task_id, "ok", None),
        ("key", key, "queue.pause", "queue", "reports", "ok", None),
        ("key", reader_id, "queue.resume", "queue", "reports", "denied", 403),
        ("anonymous", None, "GET /api/v1/workers", None, None, "denied", 401),
        ("anonymous", key, "GET /api/v1/tasks", None, None, "denied", 401),  # the key's id, never its secret
        ("key", key, "tasks.bulk", "operation", operation, "ok", None),
    ]
    first = (await events(pool))[0]
    assert (first["actor_name"], first["tenant_id"], first["user_agent"], first["trace_id"]) == (
        "ops",
        "acme",
        "deploy-bot/1",
        "req-42",
    )
    assert first["client_addr"] == "127.0.0.1"
    deleted = (await events(pool))[4]
    assert (deleted["action"], deleted["reason"]) == ("task.delete", "GDPR erasure 118")
    last = (await events(pool))[-1]
    assert last["reason"] == "fixed the bug"
    assert '"filter": {"status": "failed"}' in last["details"] and '"action": "replay"' in last["details"]
    assert all(admin.key[21:] not in str(e) for e in await events(pool))


async def test_a_change_and_its_record_commit_together_or_not_at_all(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    admin = (await api_keys.create(stores.pg, "ops", list(SCOPES))).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        task_id = (await client.post("/api/v1/tasks", json={"name": "x"}, headers=bearer(admin))).json()["task_id"]
        # The audit log refuses this one action's row: the cancel must then not happen either.
        await pool.execute(
            """
            CREATE FUNCTION refuse_cancel_event() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.action = 'task.cancel' THEN RAISE EXCEPTION 'audit refused'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_cancel_event BEFORE INSERT ON audit_events
                FOR EACH ROW EXECUTE FUNCTION refuse_cancel_event();
            """
        )
        try:
            cancel = await client.post(f"/api/v1/tasks/{task_id}/cancel", headers=bearer(admin))
        finally:
            await pool.execute("DROP TRIGGER refuse_cancel_event ON audit_events; DROP FUNCTION refuse_cancel_event()")
        status = await pool.fetchval("SELECT status FROM tasks WHERE id = $1", uuid.UUID(task_id))
    assert cancel.status_code >= 500
    assert status == "queued"
    assert [e["action"] for e in await events(pool)] == ["task.create"]


async def test_the_audit_route_filters_pages_and_needs_audit_read(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    admin = (await api_keys.create(stores.pg, "ops", list(SCOPES))).key
    viewer = (await api_keys.create(stores.pg, "viewer", ["tasks:read"])).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        for q in ("a", "b", "c"):
            await client.post(f"/api/v1/queues/{q}/pause", headers=bearer(admin))
        refused = await client.get("/api/v1/audit", headers=bearer(viewer))
        first = await client.get("/api/v1/audit?limit=2&action=queue.pause", headers=bearer(admin))
        second = await client.get(
            f"/api/v1/audit?limit=2&action=queue.pause&cursor={first.json()['next_cursor']}", headers=bearer(admin)
        )
        denied = await client.get("/api/v1/audit?outcome=denied", headers=bearer(admin))
        bad = await client.get("/api/v1/audit?outcome=maybe&colour=red", headers=bearer(admin))
        bad_cursor = await client.get("/api/v1/audit?cursor=xyz", headers=bearer(admin))
        nul = await client.get("/api/v1/audit?action=%00", headers=bearer(admin))
        # A well-formed cursor whose id is past bigint (found by a new-user trial: it was a 500).
        huge = await client.get(
            "/api/v1/audit?cursor=eyJhIjoiOTk5OS0xMi0zMVQyMzo1OTo1OSswMDowMCIsImkiOjk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OX0",
            headers=bearer(admin),
        )
    assert refused.status_code == 403
    assert [e["resource_id"] for e in first.json()["events"]] == ["c", "b"]
    assert [e["resource_id"] for e in second.json()["events"]] == ["a"] and second.json()["next_cursor"] is None
    assert first.json()["events"][0]["actor"] == {"type": "key", "id": admin[4:20], "name": "ops"}
    assert [e["action"] for e in denied.json()["events"]] == ["GET /api/v1/audit"]
    assert (bad.status_code, bad.json()["detail"]) == (422, "colour: unknown filter")
    assert (bad_cursor.status_code, bad_cursor.json()["detail"]) == (422, "cursor: is not a cursor of the audit log")
    assert (nul.status_code, nul.json()["detail"]) == (422, "action: contains a NUL character")
    assert (huge.status_code, huge.json()["detail"]) == (422, "cursor: is not a cursor of the audit log")


async def test_keys_made_with_the_cli_are_recorded_as_the_os_user(database_url: str, pool: asyncpg.Pool) -> None:
    made = await anyio.to_thread.run_sync(
        lambda: run_cli("keys", "create", "--name", "ci", "--role", "viewer", environ=env(DATABASE_URL=database_url))
    )
    assert made.code == 0, made.err
    key_id = made.out.strip()[4:20]
    revoked = await anyio.to_thread.run_sync(
        lambda: run_cli("keys", "revoke", key_id, environ=env(DATABASE_URL=database_url))
    )
    assert revoked.code == 0, revoked.err
    bad_rate = await anyio.to_thread.run_sync(
        lambda: run_cli(
            "keys", "create", "--name", "x", "--role", "viewer", "--rate-limit", "bogus=5",
            environ=env(DATABASE_URL=database_url),
        )
    )  # fmt: skip
    assert bad_rate.code == 2 and "Invalid value for '--rate-limit': bogus: unknown class" in bad_rate.err
    seen = [(e["actor_type"], e["actor_id"], e["action"], e["resource_id"], e["outcome"]) for e in await events(pool)]
    user = getpass.getuser()
    assert seen == [
        ("cli", user, "key.create", key_id, "ok"),
        ("cli", user, "key.revoke", key_id, "ok"),
        ("cli", user, "key.create", None, "error"),  # refused input is recorded too, with why
    ]


async def test_the_log_is_append_only_and_retention_drops_whole_months(stores: Any, pool: asyncpg.Pool) -> None:
    await pool.execute("INSERT INTO audit_events (actor_type, action, outcome) VALUES ('system', 'x', 'ok')")
    with pytest.raises(asyncpg.RaiseError, match="append-only"):
        await pool.execute("UPDATE audit_events SET outcome = 'error'")
    with pytest.raises(asyncpg.RaiseError, match="append-only"):
        await pool.execute("DELETE FROM audit_events")
    await pool.execute(
        "CREATE TABLE audit_events_202401 PARTITION OF audit_events FOR VALUES FROM ('2024-01-01Z') TO ('2024-02-01Z')"
    )
    await pool.execute(
        "INSERT INTO audit_events (at, actor_type, action, outcome) VALUES ('2024-01-15Z', 'system', 'old', 'ok')"
    )
    kept = await retention.run_once(stores.pg, {}, audit_keep_days=0)
    counts = await retention.run_once(stores.pg, {}, audit_keep_days=365)
    assert kept == {} and counts == {"audit_partitions": 1}
    assert await pool.fetchval("SELECT to_regclass('audit_events_202401')") is None
    rows = await events(pool)
    assert [(e["action"], e["actor_type"]) for e in rows] == [("x", "system"), ("audit.drop_partitions", "system")]
    assert rows[-1]["details"] == '{"dropped": ["audit_events_202401"]}'


async def test_the_log_refuses_truncate_of_the_table_and_of_each_month(pool: asyncpg.Pool) -> None:
    await pool.execute("INSERT INTO audit_events (actor_type, action, outcome) VALUES ('system', 'x', 'ok')")
    await pool.execute("SELECT taskmesh_audit_partitions(0, 3)")  # a month made after the guard came
    months = await pool.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'audit_events'::regclass ORDER BY 1"
    )
    assert len(months) >= 5  # the default partition, this month and three ahead
    for table in ["audit_events", *(m["relname"] for m in months)]:
        with pytest.raises(asyncpg.RaiseError, match=r"append-only \(TRUNCATE refused\)"):
            await pool.execute(f"TRUNCATE {table}")
    assert await pool.fetchval("SELECT count(*) FROM audit_events") == 1


async def test_an_unbound_keys_actions_on_a_tenants_task_are_in_that_tenants_audit_log(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    admin = await api_keys.create(stores.pg, "ops", list(SCOPES))
    auditor = await api_keys.create(stores.pg, "acme-auditor", ["audit:read"], tenant_id="acme")
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        made = await client.post("/api/v1/tasks", json={"name": "x", "tenant_id": "acme"}, headers=bearer(admin.key))
        task_id = made.json()["task_id"]
        await client.post(f"/api/v1/tasks/{task_id}/cancel", headers=bearer(admin.key))
        await client.post(f"/api/v1/tasks/{task_id}/retry", headers=bearer(admin.key))
        await client.post(f"/api/v1/tasks/{task_id}/cancel", headers=bearer(admin.key))
        await client.delete(f"/api/v1/tasks/{task_id}", params={"reason": "test"}, headers=bearer(admin.key))
        bulk = await client.post(
            "/api/v1/tasks:bulk",
            json={"filter": {"tenant_id": "acme", "status": "failed"}, "action": "replay", "reason": "fixed"},
            headers=bearer(admin.key),
        )
        seen = await client.get("/api/v1/audit", headers=bearer(auditor.key))
    assert bulk.status_code == 202
    assert seen.status_code == 200, seen.text
    assert [e["action"] for e in reversed(seen.json()["events"])] == [
        "task.create",
        "task.cancel",
        "task.retry",
        "task.cancel",
        "task.delete",
        "tasks.bulk",
    ]
    assert {e["actor"]["id"] for e in seen.json()["events"]} == {admin.record["key_id"]}
