"""Reading a workflow over HTTP in the workflow tests: now, once it is over, its nodes by id."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import wait_for


async def workflow(client: httpx.AsyncClient, workflow_id: str) -> dict[str, Any]:
    """``GET /api/v1/workflows/{workflow_id}``'s body (asserting 200)."""
    r = await client.get(f"/api/v1/workflows/{workflow_id}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def ended(client: httpx.AsyncClient, workflow_id: str, timeout: float = 15) -> dict[str, Any]:
    """The workflow once it is over (``finished_at`` set), waiting at most ``timeout`` seconds."""

    async def check() -> dict[str, Any] | None:
        body = await workflow(client, workflow_id)
        return body if body["finished_at"] is not None else None

    result: dict[str, Any] = await wait_for(check, timeout=timeout)
    return result


def nodes_of(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A workflow body's nodes by id."""
    return {n["id"]: n for n in body["nodes"]}
