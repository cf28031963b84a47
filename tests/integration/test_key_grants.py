"""A key made or rotated over the API holds no more than the key that asked: scopes, tenant, queues,
rates and expiry; and a rotated key keeps the lifetime of the key it replaces.

Keys are made in the real database, then used against a real instance over HTTP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.store import PgStore
from tests.conftest import http

pytestmark = pytest.mark.anyio

ABOVE_OWN = "a key cannot give a rate above its own"


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions")


async def make_key(pg: PgStore, name: str, *scopes: str, **kwargs: Any) -> str:
    return (await api_keys.create(pg, name, list(scopes), **kwargs)).key


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def refused(answer: Any, field: str, detail: str) -> None:
    assert answer.status_code == 403, answer.text
    assert answer.json() == {
        "type": "about:blank",
        "title": "Forbidden",
        "status": 403,
        "detail": detail,
        "errors": [{"field": field, "message": detail}],
    }


async def test_a_key_admin_cannot_rotate_a_key_that_holds_more_than_itself_and_the_victim_keeps_working(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    admin = await make_key(stores.pg, "admin", *SCOPES)
    key_admin = await make_key(stores.pg, "key-admin", "keys:admin")
    acme_admin = await make_key(stores.pg, "acme-admin", *SCOPES, tenant_id="acme")
    acme_key_admin = await make_key(stores.pg, "acme-key-admin", "keys:admin", "tasks:read", tenant_id="acme")
    peer = await make_key(stores.pg, "peer", "keys:admin")
    beyond = ", ".join(s for s in SCOPES if s != "keys:admin")
    acme_beyond = ", ".join(s for s in SCOPES if s not in ("keys:admin", "tasks:read"))
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        platform = await client.post(
            f"/api/v1/keys/{admin[4:20]}/rotate", json={"overlap_seconds": 0}, headers=bearer(key_admin)
        )
        tenant = await client.post(
            f"/api/v1/keys/{acme_admin[4:20]}/rotate", json={"overlap_seconds": 0}, headers=bearer(acme_key_admin)
        )
        same = await client.post(f"/api/v1/keys/{peer[4:20]}/rotate", headers=bearer(key_admin))
        still = await client.get("/api/v1/workers", headers=bearer(admin))
    refused(platform, "scopes", f"this key cannot give scopes it does not hold: {beyond}")
    refused(tenant, "scopes", f"this key cannot give scopes it does not hold: {acme_beyond}")
    assert (same.status_code, same.json()["scopes"]) == (201, ["keys:admin"])  # within itself: allowed
    assert still.status_code == 200
    ends = await pool.fetch(
        "SELECT id, expires_at FROM api_keys WHERE id = ANY($1::text[])", [admin[4:20], acme_admin[4:20]]
    )
    assert [r["expires_at"] for r in ends] == [None, None]
    assert await pool.fetchval("SELECT count(*) FROM api_keys") == 6  # no key was made for the refusals


async def test_a_rotated_key_keeps_the_lifetime_of_the_key_it_replaces_unless_the_body_sets_one(
    start_instance: Any, stores: Any
) -> None:
    admin = await make_key(stores.pg, "admin", *SCOPES)
    short = await make_key(stores.pg, "short", "tasks:read", expires_at=datetime.now(UTC) + timedelta(minutes=2))
    other = await make_key(stores.pg, "other", "tasks:read", expires_at=datetime.now(UTC) + timedelta(minutes=2))
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        kept = await client.post(f"/api/v1/keys/{short[4:20]}/rotate", headers=bearer(admin))
        again = await client.post(f"/api/v1/keys/{kept.json()['key_id']}/rotate", headers=bearer(admin))
        asked = await client.post(
            f"/api/v1/keys/{other[4:20]}/rotate", json={"expires_in_seconds": 3600}, headers=bearer(admin)
        )
    for answer in (kept, again):
        assert answer.status_code == 201, answer.text
        lifetime = datetime.fromisoformat(answer.json()["expires_at"]) - datetime.fromisoformat(
            answer.json()["created_at"]
        )
        assert timedelta(seconds=110) < lifetime < timedelta(seconds=130), lifetime
    lifetime = datetime.fromisoformat(asked.json()["expires_at"]) - datetime.fromisoformat(asked.json()["created_at"])
    assert timedelta(seconds=3590) < lifetime < timedelta(seconds=3610), lifetime


async def test_a_key_that_expires_gives_no_key_that_outlives_it(start_instance: Any, stores: Any) -> None:
    ends = datetime.now(UTC) + timedelta(minutes=10)
    temporary = await make_key(stores.pg, "temporary", "keys:admin", "tasks:read", expires_at=ends)
    lasting = await make_key(stores.pg, "lasting", "tasks:read")
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        made = await client.post(
            "/api/v1/keys", json={"name": "x", "scopes": ["tasks:read"]}, headers=bearer(temporary)
        )
        longer = await client.post(
            "/api/v1/keys",
            json={"name": "x", "scopes": ["tasks:read"], "expires_in_seconds": 3600},
            headers=bearer(temporary),
        )
        rotated = await client.post(f"/api/v1/keys/{lasting[4:20]}/rotate", headers=bearer(temporary))
        rotated_longer = await client.post(
            f"/api/v1/keys/{lasting[4:20]}/rotate", json={"expires_in_seconds": 3600}, headers=bearer(temporary)
        )
    assert made.status_code == 201, made.text
    assert rotated.status_code == 201, rotated.text
    for answer in (made, rotated):
        assert abs(datetime.fromisoformat(answer.json()["expires_at"]) - ends) < timedelta(seconds=1)
    detail = f"this key expires at {ends.isoformat()}; it cannot give a key that outlives it"
    refused(longer, "expires_in_seconds", detail)
    refused(rotated_longer, "expires_in_seconds", detail)


async def test_a_new_keys_rates_are_capped_at_its_creators(start_instance: Any, stores: Any) -> None:
    admin = await make_key(stores.pg, "admin", *SCOPES)
    slow = await make_key(stores.pg, "slow-admin", "keys:admin", "tasks:write", rate_limits={"write": 5})
    fast = await make_key(stores.pg, "fast", "tasks:write", rate_limits={"write": 1_000_000})
    plain = await make_key(stores.pg, "plain", "tasks:write")
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        flood = await client.post(
            "/api/v1/keys",
            json={"name": "x", "scopes": ["tasks:write"], "rate_limits": {"write": 1_000_000}},
            headers=bearer(admin),
        )
        within = await client.post(
            "/api/v1/keys",
            json={"name": "x", "scopes": ["tasks:write"], "rate_limits": {"write": 50, "read": 200}},
            headers=bearer(admin),
        )
        filled = await client.post("/api/v1/keys", json={"name": "x", "scopes": ["tasks:write"]}, headers=bearer(slow))
        above_own = await client.post(
            "/api/v1/keys",
            json={"name": "x", "scopes": ["tasks:write"], "rate_limits": {"write": 6}},
            headers=bearer(slow),
        )
        rotate_fast = await client.post(f"/api/v1/keys/{fast[4:20]}/rotate", headers=bearer(admin))
        rotate_plain = await client.post(f"/api/v1/keys/{plain[4:20]}/rotate", headers=bearer(slow))
        unknown_class = await client.post(
            "/api/v1/keys",
            json={"name": "x", "scopes": ["tasks:write"], "rate_limits": {"bulk": 1e9}},
            headers=bearer(admin),
        )
    refused(
        flood,
        "rate_limits.write",
        f"1000000 write requests per second, is above this key's own rate (1000); {ABOVE_OWN}",
    )
    assert (within.status_code, within.json()["rate_limits"]) == (201, {"write": 50.0, "read": 200.0})
    assert (filled.status_code, filled.json()["rate_limits"]) == (201, {"write": 5.0})
    refused(
        above_own,
        "rate_limits.write",
        f"6 write requests per second, is above this key's own rate (5); {ABOVE_OWN}",
    )
    refused(
        rotate_fast,
        "rate_limits.write",
        f"1000000 write requests per second, is above this key's own rate (1000); {ABOVE_OWN}",
    )
    refused(
        rotate_plain,
        "rate_limits.write",
        f"the settings' rate, 1000 write requests per second, is above this key's own rate (5); {ABOVE_OWN}",
    )
    assert (unknown_class.status_code, unknown_class.json()["detail"]) == (
        422,
        "rate_limits.bulk: unknown class; known: read, write, admin",
    )
