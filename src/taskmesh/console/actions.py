"""The console's actions (POST forms): each is the API call of the same name, sent as the visitor.

Every form carries the session's CSRF token (checked here and again by the API, which gets it
as ``X-CSRF-Token``), and a change from another site is refused by the browser's own
``Sec-Fetch-Site`` and ``Origin``. The answer is a redirect back to the page with what happened,
or with the API's problem in words. Destructive actions need a reason and a typed confirmation.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.responses import Response

from taskmesh.console import sessions
from taskmesh.console.api_client import ConsoleApi
from taskmesh.console.redirects import back
from taskmesh.console.web import REFUSALS, Visitor, failed, visitor
from taskmesh.tasks.validation import NAME_REGEX

router = APIRouter(include_in_schema=False)

Csrf = Annotated[str, Form(max_length=100)]
Reason = Annotated[str, Form(max_length=500)]


async def _acting(request: Request, csrf_token: str) -> Visitor:
    """The visitor, once the form is the console's own."""
    who = await visitor(request)
    sessions.check_change(request, who.session, csrf_token)
    return who


_QUEUE = re.compile(NAME_REGEX)


def _task(task_id: str) -> str | None:
    """The task id of a form's path, as a UUID's text; ``None`` when it is none."""
    try:
        return str(uuid.UUID(task_id))
    except ValueError:
        return None


def _bad_path(task_id: str | None = None, queue: str | None = None) -> Response | None:
    """A redirect saying what is wrong with the path's id or name (the API is not called with it)."""
    if task_id is not None and _task(task_id) is None:
        return back("/console/tasks", problem=f"{task_id[:80]!r} is not a task id (a UUID)")
    if queue is not None and not _QUEUE.fullmatch(queue):
        return back("/console/queues", problem=f"{queue[:80]!r} is not a queue name")
    return None


@router.post("/console/tasks/{task_id}/cancel")
async def cancel(request: Request, task_id: str, csrf_token: Csrf = "") -> Response:
    """``POST /api/v1/tasks/{id}/cancel``."""
    who = await _acting(request, csrf_token)
    if (bad := _bad_path(task_id=task_id)) is not None:
        return bad
    page = f"/console/tasks/{task_id}"
    async with ConsoleApi(request, who) as api:
        done = await api.post(f"/api/v1/tasks/{task_id}/cancel")
    if not done.ok:
        return failed(request, who, page, "Not cancelled", done)
    if done.body.get("cancel_requested"):
        return back(page, notice="Cancel requested: its worker stops it at its next cancellation check.")
    return back(page, notice="Cancelled: it will not run.")


@router.post("/console/tasks/{task_id}/retry")
async def retry(request: Request, task_id: str, csrf_token: Csrf = "") -> Response:
    """``POST /api/v1/tasks/{id}/retry`` (a failed task leaves the dead-letter queue: a replay)."""
    who = await _acting(request, csrf_token)
    if (bad := _bad_path(task_id=task_id)) is not None:
        return bad
    page = f"/console/tasks/{task_id}"
    async with ConsoleApi(request, who) as api:
        done = await api.post(f"/api/v1/tasks/{task_id}/retry")
    if not done.ok:
        return failed(request, who, page, "Not retried", done)
    return back(page, notice=f"Queued again on {done.body['queue_name']} (it was {done.body['previous_status']}).")


@router.post("/console/tasks/{task_id}/delete")
async def delete(
    request: Request, task_id: str, csrf_token: Csrf = "", reason: Reason = "", confirm: Csrf = ""
) -> Response:
    """``DELETE /api/v1/tasks/{id}?reason=``, once the person typed ``delete``."""
    who = await _acting(request, csrf_token)
    if (bad := _bad_path(task_id=task_id)) is not None:
        return bad
    page = f"/console/tasks/{task_id}"
    if confirm.strip().lower() != "delete":
        return back(page, problem="Not deleted: type delete in the box to confirm.")
    async with ConsoleApi(request, who) as api:
        done = await api.delete(f"/api/v1/tasks/{task_id}", {"reason": reason})
    if not done.ok:
        return failed(request, who, page, "Not deleted", done)
    return back("/console/tasks", notice=f"Task {task_id} deleted with its runs.")


@router.post("/console/queues/{queue}/pause")
async def pause(request: Request, queue: str, csrf_token: Csrf = "", reason: Reason = "") -> Response:
    """``POST /api/v1/queues/{q}/pause`` with an optional reason."""
    who = await _acting(request, csrf_token)
    if (bad := _bad_path(queue=queue)) is not None:
        return bad
    async with ConsoleApi(request, who) as api:
        done = await api.post(f"/api/v1/queues/{queue}/pause", {"reason": reason} if reason.strip() else None)
    if not done.ok:
        return failed(request, who, "/console/queues", "Not paused", done)
    return back("/console/queues", notice=f"Queue {queue} paused: no instance claims its tasks until it is resumed.")


@router.post("/console/queues/{queue}/resume")
async def resume(request: Request, queue: str, csrf_token: Csrf = "") -> Response:
    """``POST /api/v1/queues/{q}/resume``."""
    who = await _acting(request, csrf_token)
    if (bad := _bad_path(queue=queue)) is not None:
        return bad
    async with ConsoleApi(request, who) as api:
        done = await api.post(f"/api/v1/queues/{queue}/resume")
    if not done.ok:
        return failed(request, who, "/console/queues", "Not resumed", done)
    return back("/console/queues", notice=f"Queue {queue} resumed.")


def _bad_workflow(workflow_id: str) -> Response | None:
    """A redirect saying the path's workflow id is none (the API is not called with it)."""
    if _task(workflow_id) is None:
        return back("/console/workflows", problem=f"{workflow_id[:80]!r} is not a workflow id (a UUID)")
    return None


@router.post("/console/workflows/{workflow_id}/cancel")
async def cancel_workflow(request: Request, workflow_id: str, csrf_token: Csrf = "", reason: Reason = "") -> Response:
    """``POST /api/v1/workflows/{id}/cancel`` with an optional reason (kept with the workflow and audited)."""
    who = await _acting(request, csrf_token)
    if (bad := _bad_workflow(workflow_id)) is not None:
        return bad
    page = f"/console/workflows/{workflow_id}"
    async with ConsoleApi(request, who) as api:
        done = await api.post(
            f"/api/v1/workflows/{workflow_id}/cancel", {"reason": reason.strip()} if reason.strip() else None
        )
    if not done.ok:
        return failed(request, who, page, "Not cancelled", done)
    ended, asked = done.body.get("cancelled", 0), done.body.get("cancel_requested", 0)
    stopping = f"; {asked} running task{'s' if asked != 1 else ''} asked to stop" if asked else ""
    return back(page, notice=f"Workflow cancelled: {ended} task{'s' if ended != 1 else ''} ended now{stopping}.")


@router.post("/console/workflows/{workflow_id}/retry")
async def retry_workflow(request: Request, workflow_id: str, csrf_token: Csrf = "") -> Response:
    """``POST /api/v1/workflows/{id}/retry``: a failed or cancelled workflow goes on from where it stopped."""
    who = await _acting(request, csrf_token)
    if (bad := _bad_workflow(workflow_id)) is not None:
        return bad
    page = f"/console/workflows/{workflow_id}"
    async with ConsoleApi(request, who) as api:
        done = await api.post(f"/api/v1/workflows/{workflow_id}/retry")
    if not done.ok:
        return failed(request, who, page, "Not retried", done)
    queued, waiting = done.body.get("requeued", 0), done.body.get("reblocked", 0)
    return back(
        page,
        notice=f"Workflow retried from where it stopped: {queued} task{'s' if queued != 1 else ''} queued again, "
        f"{waiting} waiting for {'their' if waiting != 1 else 'its'} deps again.",
    )


Ids = Annotated[list[str], Form(max_length=1000)]


@router.post("/console/dlq/{queue}/act")
async def dlq_act(
    request: Request,
    queue: str,
    csrf_token: Csrf = "",
    do: Csrf = "",
    ids: Ids | None = None,
    priority: Csrf = "",
    count: Csrf = "",
    reason: Reason = "",
    confirm: Csrf = "",
) -> Response:
    """Replay the selected (or the oldest shown) dead letters with an optional new priority, or discard them.

    Replay is ``POST /api/v1/queues/{q}/dlq/replay``; discard is ``DELETE /api/v1/tasks/{id}?reason=``
    for each, once the person typed ``discard``.
    """
    who = await _acting(request, csrf_token)
    if (bad := _bad_path(queue=queue)) is not None:
        return bad
    page = f"/console/dlq/{queue}"
    chosen = [t for t in (ids or []) if _task(t) is not None]
    if do in ("replay", "discard") and not chosen:
        return back(page, problem="Select the tasks first (the boxes on the left).")
    if do == "discard":
        return await _discard(request, who, page, chosen, reason, confirm)
    if do not in ("replay", "replay_oldest"):
        return back(page, problem="Choose replay or discard.")
    oldest = int(count) if count.isdigit() and 0 < int(count) <= 1000 else 1
    body: dict[str, object] = {"ids": chosen} if do == "replay" else {"count": oldest}
    if priority.strip():
        if not priority.strip().isdigit() or int(priority) > 1000:
            return back(
                page, problem=f"Not replayed: the priority must be a whole number 0..1000, not {priority[:20]!r}."
            )
        body["override_priority"] = int(priority)
    async with ConsoleApi(request, who) as api:
        done = await api.post(f"/api/v1/queues/{queue}/dlq/replay", body)
    if not done.ok:
        return failed(request, who, page, "Not replayed", done)
    missed = len(done.body.get("not_replayed", []))
    tail = f"; {missed} were no longer dead-lettered" if missed else ""
    return back(page, notice=f"Replayed {done.body['count']} task{'s' if done.body['count'] != 1 else ''}{tail}.")


async def _discard(request: Request, who: Visitor, page: str, ids: list[str], reason: str, confirm: str) -> Response:
    if confirm.strip().lower() != "discard":
        return back(page, problem="Not discarded: type discard in the box to confirm.")
    gone, refusals = 0, []
    async with ConsoleApi(request, who) as api:
        for task_id in ids:
            done = await api.delete(f"/api/v1/tasks/{task_id}", {"reason": reason})
            if done.ok:
                gone += 1
                continue
            if done.status in REFUSALS:
                return failed(request, who, page, f"Discarded {gone} of {len(ids)}", done)
            refusals.append(done.problem)
            if done.status == 422:
                break  # the same answer for the rest: say it once
    if refusals:
        return back(page, problem=f"Discarded {gone} of {len(ids)}: {refusals[0]}")
    return back(page, notice=f"Discarded {gone} task{'s' if gone != 1 else ''} for good.")


@router.post("/console/schedules/{name}/{verb}")
async def schedule_act(request: Request, name: str, verb: str, csrf_token: Csrf = "") -> Response:
    """``POST /api/v1/schedules/{name}/trigger|pause|resume``."""
    who = await _acting(request, csrf_token)
    page = "/console/schedules"
    if verb not in ("trigger", "pause", "resume"):
        return back(page, problem=f"{verb[:40]!r} is not something a schedule does")
    if not _QUEUE.fullmatch(name):
        return back(page, problem=f"{name[:80]!r} is not a schedule name")
    async with ConsoleApi(request, who) as api:
        done = await api.post(f"/api/v1/schedules/{name}/{verb}")
    if not done.ok:
        return failed(request, who, page, "Not done", done)
    if verb == "trigger":
        return back(page, notice=f"{name} fired now: task {done.body.get('task_id', '')}.")
    return back(page, notice=f"{name} {'paused' if verb == 'pause' else 'resumed'}.")


SELECTION_VERBS = {"cancel": "Cancelled", "retry": "Queued again", "delete": "Deleted"}


@router.post("/console/tasks/act")
async def selection_act(
    request: Request,
    csrf_token: Csrf = "",
    do: Csrf = "",
    ids: Ids | None = None,
    reason: Reason = "",
    confirm: Csrf = "",
    back_to: Annotated[str, Form(max_length=2000)] = "/console/tasks",
) -> Response:
    """Cancel, retry (or replay) or delete the tasks selected on a page of the search: the API's call for
    each, as the visitor (for every task a filter matches, the bulk form starts one operation)."""
    who = await _acting(request, csrf_token)
    page = back_to if back_to.startswith("/console/tasks") else "/console/tasks"
    chosen = [t for t in (ids or []) if _task(t) is not None]
    if do not in SELECTION_VERBS:
        return back(page, problem="Choose cancel, retry or delete.")
    if not chosen:
        return back(page, problem="Select the tasks first (the boxes on the left).")
    if do == "delete" and confirm.strip().lower() != "delete":
        return back(page, problem="Nothing deleted: type delete in the box to confirm.")
    done_n, refusals = 0, []
    async with ConsoleApi(request, who) as api:
        for task_id in chosen:
            if do == "delete":
                done = await api.delete(f"/api/v1/tasks/{task_id}", {"reason": reason})
            else:
                done = await api.post(f"/api/v1/tasks/{task_id}/{do}")
            if done.ok:
                done_n += 1
            elif done.status in REFUSALS:
                return failed(request, who, page, f"{SELECTION_VERBS[do]} {done_n} of {len(chosen)}", done)
            else:
                refusals.append(done.problem)
    summary = f"{SELECTION_VERBS[do]}: {done_n} of {len(chosen)} selected"
    if refusals:
        return back(page, problem=f"{summary}; the first refusal: {refusals[0]}")
    return back(page, notice=f"{summary}.")
