"""The console's pages of the platform around the tasks: dead letters, workers, schedules, audit log.

Each reads through the API as its visitor (:mod:`taskmesh.console.api_client`); a view the key
may not see shows the API's refusal in words.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from cron_descriptor import ExpressionDescriptor, Options
from fastapi import APIRouter, Request
from starlette.responses import Response

from taskmesh.console.api_client import ConsoleApi, refusal
from taskmesh.console.redirects import back
from taskmesh.console.web import render, visitor
from taskmesh.tasks.validation import NAME_REGEX

router = APIRouter(include_in_schema=False)

DLQ_SHOWN = 100
"""Dead-lettered tasks one queue's page lists (oldest first)."""
AUDIT_FILTERS = ("tenant_id", "actor_id", "action", "outcome", "resource_type", "resource_id", "since", "cursor")
_NAME = re.compile(NAME_REGEX)


@router.get("/console/dlq")
async def dlq_queues(request: Request) -> Response:
    """The queues that hold dead-lettered tasks, with their counts."""
    who = await visitor(request)
    async with ConsoleApi(request, who) as api:
        queues = await api.get("/api/v1/queues")
    holding = [q for q in queues.body.get("queues", []) if q["depth"]["dead_letter"]] if queues.ok else []
    return render(request, who, "dlq_queues.html", api_refusal=refusal([queues]), queues=queues, holding=holding)


@router.get("/console/dlq/{queue}")
async def dlq_page(request: Request, queue: str) -> Response:
    """A queue's dead-lettered tasks, oldest first, with their errors; replay or discard, one or many."""
    who = await visitor(request)
    if not _NAME.fullmatch(queue):
        return back("/console/dlq", problem=f"{queue[:80]!r} is not a queue name")
    async with ConsoleApi(request, who) as api:
        dlq = await api.get(f"/api/v1/queues/{queue}/dlq", {"count": str(DLQ_SHOWN)})
    return render(request, who, "dlq.html", api_refusal=refusal([dlq]), queue=queue, dlq=dlq, shown=DLQ_SHOWN)


@router.get("/console/workers")
async def workers_page(request: Request) -> Response:
    """Each instance: its queues and concurrency, runs in flight, heartbeat age, state."""
    who = await visitor(request)
    async with ConsoleApi(request, who) as api:
        workers = await api.get("/api/v1/workers")
    ages = {w["id"]: _age_seconds(w.get("heartbeat_at")) for w in workers.body.get("workers", [])} if workers.ok else {}
    return render(request, who, "workers.html", api_refusal=refusal([workers]), workers=workers, heartbeat_ages=ages)


@router.get("/console/schedules")
async def schedules_page(request: Request) -> Response:
    """Every schedule: cron and zone, next fires in UTC and local time, last fire; pause, resume, run now."""
    who = await visitor(request)
    async with ConsoleApi(request, who) as api:
        schedules = await api.get("/api/v1/schedules")
    for schedule in schedules.body.get("schedules", []) if schedules.ok else []:
        schedule["words"] = cron_in_words(schedule["cron"])
        schedule["seconds"] = len(schedule["cron"].split()) == 6  # seconds first: fires can share a minute
    return render(request, who, "schedules.html", api_refusal=refusal([schedules]), schedules=schedules)


@router.get("/console/audit")
async def audit_page(request: Request) -> Response:
    """The audit log, newest first, with its filters in the URL."""
    who = await visitor(request)
    params = [(k, v) for k, v in request.query_params.multi_items() if k in AUDIT_FILTERS and v.strip()]
    async with ConsoleApi(request, who) as api:
        events = await api.get("/api/v1/audit", [*params, ("limit", "50")])
    filters = {k: v for k, v in params if k != "cursor"}
    refused = refusal([events])
    return render(
        request, who, "audit.html", api_refusal=refused, events=events, filters=filters, query=list(filters.items())
    )


def cron_in_words(cron: str) -> str:
    """``cron`` as a person says it ("At 03:00, Monday through Friday"); ``""`` when it cannot say."""
    options = Options()
    options.use_24hour_time_format = True
    try:
        return str(ExpressionDescriptor(cron, options).get_description())
    except Exception:  # the library raises several types for what croniter accepted; words are optional
        return ""


def _age_seconds(at: Any) -> float | None:
    if not isinstance(at, str):
        return None
    try:
        return max(0.0, (datetime.now(UTC) - datetime.fromisoformat(at)).total_seconds())
    except (ValueError, TypeError):
        return None
