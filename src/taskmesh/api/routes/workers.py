"""Worker routes: the registered instances, and the queues none of them serves."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from taskmesh.api.auth import platform_wide, require
from taskmesh.api.deps import StoresDep, json_response
from taskmesh.api.problems import problem_responses
from taskmesh.api.schemas import WorkerList
from taskmesh.tasks.records import iso, json_value, pause_to_dict

router = APIRouter()

WORKERS_LISTED = 100
UNSERVED_LISTED = 100
UNSERVED_QUEUES_READ = 10_000
PAUSED_LISTED = 1000


@router.get(
    "/api/v1/workers",
    operation_id="listWorkers",
    tags=["workers"],
    response_model=WorkerList,
    dependencies=[Depends(require("workers:read"))],
    responses=problem_responses(),
    summary="Registered instances, live first, with their in-flight runs; queued tasks no live instance serves",
)
async def list_workers(request: Request, stores: StoresDep) -> Response:
    """Up to 100 instances, live ones first, and ``unserved_queues``: up to 100 queues holding
    queued tasks that no live (running or draining) instance serves, most tasks first,
    as ``{"queue", "queued"}``; and ``paused_queues``: up to 1,000 paused queues by name, as
    ``{"queue", "paused", "paused_at", "reason"}``."""
    platform_wide(request, "workers:read", "the workers' list", every_queue=True)
    rows = await stores.pg.workers.list(WORKERS_LISTED)
    served = await stores.pg.workers.served_queues(UNSERVED_QUEUES_READ)
    waiting = await stores.pg.tasks.count_queued_unserved(served, UNSERVED_QUEUES_READ)
    paused = await stores.pg.queues.list_paused(PAUSED_LISTED)
    unserved = sorted(({"queue": r["queue"], "queued": r["queued"]} for r in waiting), key=_most_first)
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
    return json_response(
        {
            "workers": workers,
            "unserved_queues": unserved[:UNSERVED_LISTED],
            "paused_queues": [pause_to_dict(r["name"], r) for r in paused],
        }
    )


def _most_first(item: dict[str, Any]) -> tuple[int, str]:
    return -item["queued"], item["queue"]
