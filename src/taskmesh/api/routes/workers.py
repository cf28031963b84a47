"""Worker routes: the registered instances."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from taskmesh.api.deps import StoresDep, json_response
from taskmesh.records import iso, json_value

router = APIRouter()

WORKERS_LISTED = 100


@router.get("/api/v1/workers", summary="Registered instances, live first, with their in-flight runs")
async def list_workers(stores: StoresDep) -> Response:
    """Up to 100 instances, live ones first."""
    rows = await stores.pg.workers.list(WORKERS_LISTED)
    workers = [
        {
            "id": r["id"],
            "host": r["host"],
            "pid": r["pid"],
            "queues": json_value(r["queues"]),
            "version": r["version"],
            "state": r["state"],
            "started_at": iso(r["started_at"]),
            "heartbeat_at": iso(r["heartbeat_at"]),
            "stopped_at": iso(r["stopped_at"]),
            "in_flight": r["in_flight"],
        }
        for r in rows
    ]
    return json_response({"workers": workers})
