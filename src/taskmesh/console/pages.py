"""The console's pages (GET): each reads through the API as its visitor and renders a template.

A view the visitor's key may not see (a tenant key on the queue list, a viewer on the audit log)
shows the API's refusal in words instead of data; nothing is hidden by the console alone.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from taskmesh.console.api_client import ConsoleApi, refusal
from taskmesh.console.charts import overview_charts
from taskmesh.console.limit_pages import waiting
from taskmesh.console.redirects import back
from taskmesh.console.web import render, visitor
from taskmesh.tasks.search import FILTERS
from taskmesh.tasks.states import TaskStatus

router = APIRouter(include_in_schema=False)

SEARCH_FILTERS = tuple(f for f in FILTERS if f not in ("limit", "cursor"))
"""The search's filters the tasks page passes on (and every ``payload.<path>`` one)."""
STATUSES = tuple(s.value for s in TaskStatus)
PAGE_SIZE = 50


@router.get("/console")
async def home() -> Response:
    """The console's front page is the overview."""
    return RedirectResponse("/console/overview", status_code=303)


@router.get("/console/overview")
async def overview(request: Request) -> Response:
    """Queues with their depth and oldest ready age, runs of the last minute, live workers."""
    who = await visitor(request)
    if who.principal.tenant_id is not None:  # every view of the overview counts every tenant
        return RedirectResponse("/console/tasks", status_code=303)
    window = "day" if request.query_params.get("window") == "day" else "hour"
    chart_queue = request.query_params.get("queue", "")
    wanted = {"window": window, **({"queue": chart_queue} if chart_queue else {})}
    async with ConsoleApi(request, who) as api:
        queues, workers, past = await api.get_all(
            ("/api/v1/queues", None), ("/api/v1/workers", None), ("/api/v1/history", wanted)
        )
    states: dict[str, int] = {}
    for w in workers.body.get("workers", []) if workers.ok else []:
        states[w["state"]] = states.get(w["state"], 0) + 1
    return render(
        request,
        who,
        "overview.html",
        api_refusal=refusal([queues, past], [workers]),
        queues=queues,
        workers=workers,
        worker_states=states,
        history=past,
        charts=overview_charts(past.body) if past.ok else [],
        window=window,
        chart_queue=chart_queue,
        live_url="/console/overview" + (f"?{urlencode(wanted)}" if wanted != {"window": "hour"} else ""),
        size=_size(past.body.get("rollup")) if past.ok else None,
    )


def _size(rollup: dict[str, Any] | None) -> str | None:
    """The rollup's size in words: ``"1.2 MiB, about 43,000 rows, since 2026-11-02 10:00"``."""
    if not rollup:
        return None
    kib = rollup["bytes"] / 1024
    size = f"{kib / 1024:,.1f} MiB" if kib >= 1024 else f"{kib:,.0f} KiB"
    rows = f", about {rollup['rows']:,} rows" if rollup.get("rows") is not None else ""
    since = f", since {rollup['since'][:16].replace('T', ' ')} UTC" if rollup.get("since") else ""
    return size + rows + since


@router.get("/console/queues")
async def queues_page(request: Request) -> Response:
    """Every queue: depth by state, paused or not, and pause and resume for ``queues:admin``."""
    who = await visitor(request)
    async with ConsoleApi(request, who) as api:
        queues = await api.get("/api/v1/queues")
    return render(request, who, "queues.html", api_refusal=refusal([queues]), queues=queues)


@router.get("/console/tasks")
async def tasks_page(request: Request) -> Response:
    """The search of the operator API, its filters in the URL (bookmarkable), page by page."""
    who = await visitor(request)
    wanted = request.query_params.get("q", "").strip()
    if wanted:
        try:
            return RedirectResponse(f"/console/tasks/{uuid.UUID(wanted)}", status_code=303)
        except ValueError:
            return back("/console/tasks", problem=f"{wanted[:80]!r} is not a task id (a UUID)")
    params = search_params(request)
    canonical = [(k, v) for k, v in params if not (k == "order" and v == "desc")]
    if canonical != request.query_params.multi_items():
        # A submitted form carries every box, empty ones too: its bookmark is the filters alone.
        return RedirectResponse(f"/console/tasks?{urlencode(canonical)}" if canonical else "/console/tasks", 303)
    async with ConsoleApi(request, who) as api:
        found = await api.get("/api/v1/tasks", [*params, ("limit", str(PAGE_SIZE))])
    filters: dict[str, Any] = {}
    for name, value in params:
        filters.setdefault(name, []).append(value)
    return render(
        request,
        who,
        "tasks.html",
        api_refusal=refusal([found]),
        found=found,
        filters=filters,
        statuses=STATUSES,
        query=[(k, v) for k, v in params if k != "cursor"],
        payload_text=" ".join(f"{k[len('payload.') :]}={v}" for k, v in params if k.startswith("payload.")),
        request_path=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
    )


@router.get("/console/tasks/{task_id}")
async def task_page(request: Request, task_id: str) -> Response:
    """One task: why it waits (if it does), its fields, every run on a timeline, and the actions its state allows."""
    who = await visitor(request)
    if not _is_uuid(task_id):
        return back("/console/tasks", problem=f"{task_id[:80]!r} is not a task id (a UUID)")
    async with ConsoleApi(request, who) as api:
        task, runs = await api.get_all((f"/api/v1/tasks/{task_id}", None), (f"/api/v1/tasks/{task_id}/runs", None))
        body = task.body.get("task", {}) if task.ok else {}
        body = {k: v for k, v in body.items() if k not in ("payload", "result")}  # fetched on demand
        waits = await waiting(api, body) if task.ok else None
    for run in runs.body.get("runs", []) if runs.ok else []:
        run["duration_ms"] = _duration_ms(run.get("started_at"), run.get("finished_at"))
    refused = refusal([task], [runs])
    return render(
        request, who, "task.html", api_refusal=refused, task_id=task_id, answer=task, task=body, runs=runs, waits=waits
    )


@router.get("/console/tasks/{task_id}/data")
async def task_data(request: Request, task_id: str) -> Response:
    """The task's payload and latest result, fetched when the person opens them."""
    who = await visitor(request)
    if not _is_uuid(task_id):
        return back("/console/tasks", problem=f"{task_id[:80]!r} is not a task id (a UUID)")
    async with ConsoleApi(request, who) as api:
        task = await api.get(f"/api/v1/tasks/{task_id}")
    data = task.body.get("task", {}) if task.ok else {}
    latest = task.body.get("latest_run") or {} if task.ok else {}
    return render(
        request,
        who,
        "task_data.html",
        api_refusal=refusal([task]),
        answer=task,
        payload=json_text(data.get("payload")),
        result=None if latest.get("result") is None else json_text(latest["result"]),
        task_id=task_id,
    )


def search_params(request: Request) -> list[tuple[str, str]]:
    """The page's query, narrowed to the search's filters, empty values left out.

    The form's one ``payload`` box (``customer.id=42``, several separated by spaces) becomes the
    search's ``payload.customer.id=42``; a bookmark may also carry ``payload.<path>`` directly.
    """
    params = []
    for name, value in request.query_params.multi_items():
        if not value.strip():
            continue
        if name == "payload":
            for term in value.split():
                path, sep, wanted = term.partition("=")
                if sep and path:
                    params.append((f"payload.{path}", wanted))
        elif name in SEARCH_FILTERS or name == "cursor" or name.startswith("payload."):
            params.append((name, value))
    return params


def json_text(value: Any) -> str:
    """``value`` as indented JSON text (the template escapes it: a payload is never markup)."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def _duration_ms(started: str | None, finished: str | None) -> float | None:
    if not started or not finished:
        return None
    try:
        return (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds() * 1000
    except ValueError:
        return None


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
