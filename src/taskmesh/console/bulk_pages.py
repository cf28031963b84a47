"""Bulk actions from the console: a dry-run count of what a filter matches, a typed confirmation, and the
operation's progress, over ``POST /api/v1/tasks:bulk`` and ``GET /api/v1/operations/{id}``.

The tasks page posts its filters as ``f.<name>`` fields; the same filters then go to the API,
which acts on every task they match (not only one page), in batches, as one operation.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from starlette.responses import Response

from taskmesh.console import sessions
from taskmesh.console.api_client import ConsoleApi, refusal
from taskmesh.console.pages import _is_uuid
from taskmesh.console.redirects import back
from taskmesh.console.web import Visitor, failed, render, visitor
from taskmesh.tasks.search import payload_scalar

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
    """A dry run (``dry_run`` in the form) renders the count and the confirmation; else the operation starts.

    A confirmation that is not the word, or a start the API turns down (a 422), renders the dry run again
    with the filters, the reason and what was wrong (422): nothing is lost but the mistyped word.
    """
    who = await visitor(request)
    sessions.check_change(request, who.session, csrf_token)
    form = await request.form()
    filter_ = await _filter(request)
    query = [(k[2:], v) for k, v in form.multi_items() if k.startswith("f.") and isinstance(v, str) and v.strip()]
    search_page = f"/console/tasks?{urlencode(query)}" if query else "/console/tasks"
    if action not in ACTIONS:
        return back(search_page, problem=f"{action[:40]!r} is not a bulk action")
    word = CONFIRM_WORD.get(action)
    async with ConsoleApi(request, who) as api:
        if form.get("dry_run"):
            return await _dry_run(request, who, api, action, filter_, query)
        if word is not None and confirm.strip().lower() != word:
            typed = f"{confirm.strip()[:40]!r}" if confirm.strip() else "nothing"
            mistake = f"Nothing done: type {word} in the box to confirm (it held {typed})."
            return await _dry_run(request, who, api, action, filter_, query, mistake=mistake, reason=reason)
        started = await api.post("/api/v1/tasks:bulk", {"filter": filter_, "action": action, "reason": reason})
        if started.status in (409, 422):
            mistake = f"Not started: {started.problem}"
            return await _dry_run(request, who, api, action, filter_, query, mistake=mistake, reason=reason)
    if not started.ok:
        return failed(request, who, search_page, "Not started", started)
    expected = form.get("expected")
    tail = f"?expected={expected}" if isinstance(expected, str) and expected.isdigit() else ""
    return back(f"/console/operations/{started.body['operation_id']}{tail}", notice="Started.")


async def _dry_run(
    request: Request,
    who: Visitor,
    api: ConsoleApi,
    action: str,
    filter_: dict[str, Any],
    query: list[tuple[str, str]],
    *,
    mistake: str | None = None,
    reason: str = "",
) -> Response:
    """The dry run's page: the count of what ``filter_`` matches now and the confirmation form; with a
    ``mistake`` (the form sent wrong), that form again with it said (422) and the ``reason`` kept."""
    count = await api.post("/api/v1/tasks:bulk", {"filter": filter_, "action": action, "dry_run": True})
    return render(
        request,
        who,
        "bulk_confirm.html",
        422 if mistake else 200,
        api_refusal=refusal([count]),
        action=action,
        count=count,
        query=query,
        word=CONFIRM_WORD.get(action),
        mistake=mistake,
        reason=reason,
    )


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
