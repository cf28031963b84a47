"""Handlers both releases of the upgrade test load (``TASKMESH_HANDLERS=tests.upgrade.handlers``).

Only ``taskmesh.task`` and plain payloads: the API both the previous release and this one have.
"""

from __future__ import annotations

import os
from typing import Any

import asyncpg

import taskmesh


@taskmesh.task("upgrade.echo")
async def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


@taskmesh.task("upgrade.tick")
async def tick(payload: dict[str, Any]) -> None:
    return None


@taskmesh.task("upgrade.flaky", max_retries=0)
async def flaky(payload: dict[str, Any]) -> str:
    """Fails until a row of ``upgrade_flags`` names its payload's ``flag`` (then succeeds)."""
    conn = await asyncpg.connect(os.environ["DATABASE_URL"])
    try:
        found = await conn.fetchval("SELECT 1 FROM upgrade_flags WHERE flag = $1", payload["flag"])
    finally:
        await conn.close()
    if not found:
        raise RuntimeError("not yet")
    return "fixed"
