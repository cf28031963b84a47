"""Bulk actions from the console: a dry-run count of what a filter matches, a typed confirmation, and the
operation's progress, over ``POST /api/v1/tasks:bulk`` and ``GET /api/v1/operations/{id}``.

The tasks page posts its filters as ``f.<name>`` fields; the same filters then go to the API,
which acts on every task they match (not only one page), in batches, as one operation.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from starlette.responses import Response

from taskmesh.console import sessions
from taskmesh.console.api_client import ConsoleApi, refusal
from taskmesh.console.pages import _is_uuid
from taskmesh.console.web import back, failed, render, visitor
from taskmesh.search import payload_scalar

router = APIRouter(include_in_schema=False)

ACTIONS = ("retry", "replay", "cancel", "delete")
CONFIRM_WORD = {"cancel": "cancel", "delete": "delete"}
"""Destructive actions and the word the person types to confirm them."""
Small = Annotated[str, Form(max_length=100)]
Reason = Annotated[str, Form(max_length=500)]


async def _filter(request: Request) -> dict[str, Any]:
    """The bulk filter from the form's ``f.<name>`` fields (payload values as the search reads them)."""
    form = await request.form()
    found: dict[str, Any] = {}
    for key, value in form.multi_items():
        if not key.startswith("f.") or not isinstance(value, str) or not value.strip():
            continue
        name = key[2:]
        if name == "status":
            found.setdefault("status", []).append(value)
        elif name.startswith("payload."):
            found[name] = payload_scalar(value)
        else:
            found[name] = value
    return found


@router.post("/console/bulk")
async def bulk(
    request: Request, csrf_token: Small = "", action: Small = "", reason: Reason = "", confirm: Small = ""
) -> Response:
    """A dry run (``dry_run`` in the form) renders the count and the confirmation; else the operation starts."""
    who = await visitor(request)
    sessions.check_change(request, who.session, csrf_token)
    form = await request.form()
    filter_ = await _filter(request)
    query = [(k[2:], v) for k, v in form.multi_items() if k.startswith("f.") and isinstance(v, str) and v.strip()]
    search_page = "/console/tasks"
    if action not in ACTIONS:
        return back(search_page, problem=f"{action[:40]!r} is not a bulk action")
    async with ConsoleApi(request, who) as api:
        if form.get("dry_run"):
            count = await api.post("/api/v1/tasks:bulk", {"filter": filter_, "action": action, "dry_run": True})
            return render(
                request,
                who,
                "bulk_confirm.html",
                api_refusal=refusal([count]),
                action=action,
                count=count,
                query=query,
                word=CONFIRM_WORD.get(action),
            )
        word = CONFIRM_WORD.get(action)
        if word is not None and confirm.strip().lower() != word:
            return back(search_page, problem=f"Nothing done: type {word} in the box to confirm.")
        started = await api.post("/api/v1/tasks:bulk", {"filter": filter_, "action": action, "reason": reason})
    if not started.ok:
        return failed(request, who, search_page, "Not started", started)
    expected = form.get("expected")
    tail = f"?expected={expected}" if isinstance(expected, str) and expected.isdigit() else ""
    return back(f"/console/operations/{started.body['operation_id']}{tail}", notice="Started.")


@router.get("/console/operations/{operation_id}")
async def operation(request: Request, operation_id: str) -> Response:
    """A bulk operation's progress: done and skipped so far, and its end."""
    who = await visitor(request)
    if not _is_uuid(operation_id):
        return back("/console/tasks", problem=f"{operation_id[:80]!r} is not an operation id")
    async with ConsoleApi(request, who) as api:
        op = await api.get(f"/api/v1/operations/{operation_id}")
    raw = request.query_params.get("expected", "")
    expected = int(raw) if raw.isdigit() and len(raw) < 10 else None
    return render(
        request, who, "operation.html", api_refusal=refusal([op]), op=op, operation_id=operation_id, expected=expected
    )
