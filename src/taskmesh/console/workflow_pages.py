"""The console's workflow pages (GET): the list of workflows, one workflow's graph, and a node's task.

Each reads through the API as its visitor (``GET /api/v1/workflows``, ``GET /api/v1/workflows/{id}``,
and the task search for a map node's failed task), so a tenant key sees its tenant's workflows only
and a key without ``tasks:read`` gets the API's refusal in words. The graph is drawn on the server
(:mod:`taskmesh.console.workflow_graph`); cancel and retry are forms of :mod:`taskmesh.console.actions`.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from taskmesh.console.api_client import ConsoleApi, refusal
from taskmesh.console.redirects import back
from taskmesh.console.web import render, visitor
from taskmesh.console.workflow_graph import COUNT_ORDER, STATES, layout, shown_state
from taskmesh.tasks.states import WorkflowStatus

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 50
LIST_FILTERS = ("name", "status", "tenant_id", "cursor")
"""The listing's filters the list page passes on (its form's boxes, and the next page's cursor)."""
WORKFLOW_STATUSES = tuple(s.value for s in WorkflowStatus)
FAILED_PAGES = 4
"""Pages of the task search (500 tasks each) read to find a map node's first failed task."""
_NODE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


@router.get("/console/workflows")
async def workflows_page(request: Request) -> Response:
    """The workflows, newest first, filtered by name, status and tenant (in the URL), page by page."""
    who = await visitor(request)
    params = [(k, v.strip()) for k, v in request.query_params.multi_items() if k in LIST_FILTERS and v.strip()]
    if params != request.query_params.multi_items():
        # A submitted form carries every box, empty ones too: its bookmark is the filters alone.
        return RedirectResponse(f"/console/workflows?{urlencode(params)}" if params else "/console/workflows", 303)
    async with ConsoleApi(request, who) as api:
        found = await api.get("/api/v1/workflows", [*params, ("limit", str(PAGE_SIZE))])
    filters = {k: v for k, v in params if k != "cursor"}
    return render(
        request,
        who,
        "workflows.html",
        api_refusal=refusal([found]),
        found=found,
        filters=filters,
        statuses=WORKFLOW_STATUSES,
        count_order=COUNT_ORDER,
        query=list(filters.items()),
    )


@router.get("/console/workflows/{workflow_id}")
async def workflow_page(request: Request, workflow_id: str) -> Response:
    """One workflow: its fields, its graph (nodes coloured by state), its callbacks, a table of its nodes,
    and cancel or retry as its state and the visitor's key allow. A running one follows itself."""
    who = await visitor(request)
    if not _is_uuid(workflow_id):
        return back("/console/workflows", problem=f"{workflow_id[:80]!r} is not a workflow id (a UUID)")
    async with ConsoleApi(request, who) as api:
        found = await api.get(f"/api/v1/workflows/{workflow_id}")
    body: dict[str, Any] = found.body if found.ok else {}
    nodes: list[dict[str, Any]] = [{**n, "state": shown_state(n)} for n in body.get("nodes", [])]
    body = {**body, "nodes": nodes}
    return render(
        request,
        who,
        "workflow.html",
        api_refusal=refusal([found]),
        workflow_id=workflow_id,
        answer=found,
        wf=body,
        graph=layout(workflow_id, nodes),
        states=STATES,
        count_order=COUNT_ORDER,
        context_text=json.dumps(body.get("context"), indent=2, ensure_ascii=False),
    )


@router.get("/console/workflows/{workflow_id}/nodes/{node_id}")
async def node_task(request: Request, workflow_id: str, node_id: str) -> Response:
    """A node's task: a plain or callback node's own; a map node's first failed task (in item order) if
    any failed, else its first. A failed task the bounded search does not find leads to the task search
    of the node's failed tasks; a node without a task yet goes back to the workflow, saying why."""
    who = await visitor(request)
    if not _is_uuid(workflow_id):
        return back("/console/workflows", problem=f"{workflow_id[:80]!r} is not a workflow id (a UUID)")
    page = f"/console/workflows/{workflow_id}"
    if not _NODE_ID.fullmatch(node_id):
        return back(page, problem=f"{node_id[:80]!r} is not a node id")
    async with ConsoleApi(request, who) as api:
        found = await api.get(page.replace("/console/", "/api/v1/", 1))
        if not found.ok:
            return render(request, who, "workflow.html", api_refusal=found, workflow_id=workflow_id, answer=found)
        node = next((n for n in found.body["nodes"] if n["id"] == node_id), None)
        if node is None:
            return back(page, problem=f"The workflow has no node {node_id!r}.")
        ids = node.get("task_ids") if node.get("kind") == "map" else [node["task_id"]] if node.get("task_id") else []
        if not ids:
            why = ", ".join(node.get("waiting_for") or []) or "its source"
            return back(page, problem=f"Node {node_id} has no task yet: it waits for {why}.")
        if node.get("kind") != "map" or not (node.get("counts") or {}).get("failed"):
            return RedirectResponse(f"/console/tasks/{ids[0]}", 303)
        failed = await _first_failed(api, node["task"], found.body["created_at"], ids)
    if failed is not None:
        return RedirectResponse(f"/console/tasks/{failed}", 303)
    search = {"name": node["task"], "status": "failed", "created_after": found.body["created_at"], "order": "asc"}
    return back(
        f"/console/tasks?{urlencode(search)}",
        notice=f"Node {node_id}'s failed tasks are among these (tasks of the same name failed since it started).",
    )


async def _first_failed(api: ConsoleApi, task: str, since: str, ids: list[str]) -> str | None:
    """The first of ``ids`` (in item order) that the task search finds failed: tasks named ``task`` created
    since the workflow, oldest first, up to :data:`FAILED_PAGES` pages."""
    index = {task_id: i for i, task_id in enumerate(ids)}
    params = [("name", task), ("status", "failed"), ("created_after", since), ("order", "asc"), ("limit", "500")]
    cursor: str | None = None
    for _ in range(FAILED_PAGES):
        found = await api.get("/api/v1/tasks", [*params, *([("cursor", cursor)] if cursor else [])])
        if not found.ok:
            return None
        ours = [str(t["id"]) for t in found.body.get("tasks", []) if t["id"] in index]
        if ours:
            return min(ours, key=index.__getitem__)
        cursor = found.body.get("next_cursor")
        if not cursor:
            return None
    return None


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
