"""Handlers for tests that run taskmesh as a real process (TASKMESH_HANDLERS=tests.process_handlers)."""

from __future__ import annotations

from typing import Any

import anyio

import taskmesh


@taskmesh.task("sleepy")
async def sleepy(payload: dict[str, Any]) -> str:
    await anyio.sleep(float(payload.get("seconds", 0)))
    return "slept"
