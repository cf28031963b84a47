"""Task routes: create (one or a batch), read, list runs, cancel, retry, delete."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from taskmesh.api.auth import demand, reach_of, require
from taskmesh.api.deps import (
    BATCH_MAX,
    REASON_PARAMETER,
    OperationIdPath,
    StateDep,
    StoresDep,
    TaskIdPath,
    TasksDep,
    UndocumentedQuery,
    atomic_refusal,
    batch_items,
    body_schema,
    json_response,
    parse_body,
    parse_task_id,
    query_parameter,
    read_json,
    required_reason,
    task_warnings,
    with_trace,
)
from taskmesh.api.problems import problem, problem_responses
from taskmesh.api.schemas import (
    BatchCreated,
    BulkDryRun,
    Cancellation,
    Operation,
    RetriedTask,
    TaskCreated,
    TaskPage,
    TaskRuns,
    TaskWithLatestRun,
)
from taskmesh.errors import BeyondReachError, InvalidTaskError, StoreError, TaskNotFoundError
from taskmesh.observability.logs import get_logger
from taskmesh.security import audit
from taskmesh.security.tenancy import Reach
from taskmesh.tasks.bulk import BulkRequest, operation_to_dict, parse_filter
from taskmesh.tasks.bulk import dry_run as bulk_dry_run
from taskmesh.tasks.bulk import start as bulk_start
from taskmesh.tasks.search import parse_search, search
from taskmesh.tasks.states import BulkAction, TaskStatus
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import NAME_REGEX, StrictInt, TaskSpec, check_json, parse_task_spec

router = APIRouter()
log = get_logger("taskmesh.api")


class BatchRequest(BaseModel):
    """Body of ``POST /api/v1/tasks:batch``: up to 1,000 tasks; ``atomic`` stores all or none."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[TaskSpec] = Field(min_length=1, max_length=BATCH_MAX)
    atomic: bool = False


@router.post(
    "/api/v1/tasks",
    operation_id="createTask",
    tags=["tasks"],
    dependencies=[Depends(require("tasks:write"))],
    responses={
        200: {"description": "The dedup_key repeats: the existing task, `deduplicated: true`", "model": TaskCreated},
        **problem_responses(400, 409, 413, 422),
    },
    status_code=201,
    response_model=TaskCreated,
    openapi_extra=body_schema(TaskSpec),
    summary="Create a task (200 with the existing task_id when dedup_key repeats)",
)
async def create_task(request: Request, tasks: TasksDep, state: StateDep) -> Response:
    """Validate and store one task, then push it (201; 200 when its ``dedup_key`` repeats).

    The 201 answer carries ``warnings`` when no live instance serves the task's queue or has a
    handler for its name there.
    """
    data = await read_json(request, "payload")
    spec = with_trace(parse_task_spec(data, max_delay_seconds=tasks.max_delay_seconds), request)
    await tasks.learn()  # the queue and payload check of a name only another instance has a handler for
    spec = bind_to_reach(spec, reach_of(request), tasks)
    await state.quotas.check(tasks.pg, tasks.redis, [spec])
    result = await tasks.enqueue(spec)
    body: dict[str, Any] = {"task_id": str(result.task_id), "status": result.status, "trace_id": result.trace_id}
    if not result.created:
        return json_response({**body, "deduplicated": True}, 200)
    warnings = await task_warnings(state, [(result.queue, spec.name)] if result.queue else [])
    if warnings:
        body["warnings"] = list(warnings.values())
    return json_response(body, 201, headers={"Location": f"/api/v1/tasks/{result.task_id}"})


def bind_to_reach(spec: TaskSpec, reach: Reach, tasks: Tasks, field_prefix: str = "") -> TaskSpec:
    """The task in the caller's tenant (filled in when the body has none) and on one of its queues.

    :raises BeyondReachError: another tenant, or a queue beyond the key's (403 naming the field).
    """
    if reach.tenant_id is not None:
        if spec.tenant_id is None:
            spec = spec.model_copy(update={"tenant_id": reach.tenant_id})
        elif spec.tenant_id != reach.tenant_id:
            raise BeyondReachError(
                f"{field_prefix}tenant_id",
                f"this key is bound to tenant {reach.tenant_id!r}; it cannot create tasks of tenant {spec.tenant_id!r}",
            )
    if reach.queues is not None:
        queue = tasks.queue_for(spec.name, spec.queue_name if "queue_name" in spec.model_fields_set else None)
        if queue not in reach.queues:
            raise BeyondReachError(
                f"{field_prefix}queue_name",
                f"this key may use the queues {', '.join(sorted(reach.queues))}; not {queue!r}",
            )
    return spec


async def check_task_reach(tasks: Tasks, task_id: uuid.UUID, reach: Reach) -> None:
    """Refuse a task beyond the caller's tenant or queues exactly as a missing one; the task's tenant
    goes into the request's audit event, so that an unbound key's action on a tenant's task is in
    that tenant's audit log too.

    :raises TaskNotFoundError: no task has this id, or not one the caller reaches (404).
    """
    row = await tasks.pg.tasks.owner(task_id)
    if row is not None and row["tenant_id"] is not None and reach.tenant_id is None:
        audit.note(tenant_id=row["tenant_id"])
    if not reach.unlimited and (row is None or not reach.sees(row["tenant_id"], row["queue"])):
        raise TaskNotFoundError(str(task_id))


def _parse_batch(data: Any, tasks: Tasks) -> tuple[list[TaskSpec], list[int], list[dict[str, Any]], bool]:
    items, atomic = batch_items(data, "tasks")
    specs: list[TaskSpec] = []
    positions: list[int] = []
    results: list[dict[str, Any]] = [{} for _ in items]
    for i, item in enumerate(items):
        try:
            spec = parse_task_spec(item, max_delay_seconds=tasks.max_delay_seconds)
            tasks.check_payload(spec)
            specs.append(spec)
            positions.append(i)
        except InvalidTaskError as exc:
            results[i] = {
                "index": i,
                "status": "rejected",
                "errors": [{"field": f"tasks[{i}].{f}", "message": m} for f, m in exc.errors],
            }
    return specs, positions, results, atomic


@router.post(
    "/api/v1/tasks:batch",
    operation_id="createTaskBatch",
    tags=["tasks"],
    response_model=BatchCreated,
    dependencies=[Depends(require("tasks:write"))],
    responses=problem_responses(400, 409, 413, 422),
    openapi_extra=body_schema(BatchRequest),
    summary="Create up to 1,000 tasks with one statement; each item's outcome is reported",
)
async def create_batch(request: Request, tasks: TasksDep, state: StateDep) -> Response:
    """Store the valid items of a batch (all or none when ``atomic``) and report each item.

    A created item no live instance will run carries ``warnings``, as a single create.
    """
    data = await read_json(request, "tasks")
    await tasks.learn()
    specs, positions, results, atomic = _parse_batch(data, tasks)
    reach = reach_of(request)
    specs = [bind_to_reach(s, reach, tasks, f"tasks[{i}].") for s, i in zip(specs, positions, strict=True)]
    rejected = len(results) - len(specs)
    await state.quotas.check(tasks.pg, tasks.redis, specs, [f"tasks[{i}]." for i in positions])
    if atomic and rejected:
        return atomic_refusal(results)
    outcomes = await tasks.enqueue_many([with_trace(s, request) for s in specs])
    named = [(o.queue or "", spec.name) for o, spec in zip(outcomes, specs, strict=True)]
    warnings = await task_warnings(state, [(q, n) for q, n in named if q])
    for i, outcome, (queue, name) in zip(positions, outcomes, named, strict=True):
        results[i] = {
            "index": i,
            "status": "created" if outcome.created else "deduplicated",
            "task_id": str(outcome.task_id),
            "trace_id": outcome.trace_id,
        }
        if (queue, name) in warnings:
            results[i]["warnings"] = [warnings[queue, name]]
    created = sum(1 for o in outcomes if o.created)
    return json_response(
        {"created": created, "deduplicated": len(outcomes) - created, "rejected": rejected, "results": results}
    )


WAIT_MAX_SECONDS = 60.0
FINISHED = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)
FALLBACK_READ_SECONDS = 1.0
"""How often a waiter reads its task while the instance's subscription is down."""
WAIT_PARAMETER = query_parameter(
    "wait", {"type": "number", "minimum": 0, "maximum": WAIT_MAX_SECONDS}, "Seconds to wait for the task to finish"
)


@router.get(
    "/api/v1/tasks/{task_id}",
    operation_id="getTask",
    tags=["tasks"],
    response_model=TaskWithLatestRun,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(404, 422),
    openapi_extra={"parameters": [WAIT_PARAMETER]},
    summary="A task and its latest run; with wait=N, once it finished or N s passed",
)
async def get_task(
    task_id: TaskIdPath, request: Request, tasks: TasksDep, state: StateDep, wait: UndocumentedQuery = None
) -> Response:
    """The task and its latest run, read in one statement.

    ``wait`` (seconds, 0..60): answer as soon as the task is completed, failed or cancelled,
    or when ``wait`` has passed (then in whatever state it is). The end is heard through
    Redis (``services/finished_feed.py``), not by reading the task in a loop.
    """
    tid = parse_task_id(task_id)
    seconds = parse_wait(wait)
    task, run = await tasks.get(tid)
    if not reach_of(request).sees(task["tenant_id"], task["queue_name"]):
        raise TaskNotFoundError(str(tid))  # as for a missing task: the id tells nothing
    if not seconds or task["status"] in FINISHED:
        return json_response({"task": task, "latest_run": run})
    deadline = anyio.current_time() + seconds
    with state.waiters.waiting(str(tid)) as waiter:
        try:
            await tasks.redis.finished.mark_waiting(seconds)
        except StoreError as exc:  # nobody announces then: the fallback reads find the end
            log.warning("wait_unannounced", task_id=str(tid), error=str(exc))
        while True:
            task, run = await tasks.get(tid)  # after the flag is set: an end committed since is announced
            left = deadline - anyio.current_time()
            if task["status"] in FINISHED or left <= 0:
                return json_response({"task": task, "latest_run": run})
            with anyio.move_on_after(left if state.waiters.live else min(left, FALLBACK_READ_SECONDS)):
                await waiter.event.wait()
            waiter.rearm()


def parse_wait(raw: str | None) -> float:
    """The ``wait`` query parameter in seconds (``None``: 0).

    :raises InvalidTaskError: not a number of seconds between 0 and 60 (422 naming ``wait``).
    """
    if raw is None:
        return 0.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= WAIT_MAX_SECONDS:  # also refuses nan and inf
        raise InvalidTaskError("wait", f"must be a number of seconds between 0 and {WAIT_MAX_SECONDS:g}")
    return seconds


@router.get(
    "/api/v1/tasks/{task_id}/runs",
    operation_id="listTaskRuns",
    tags=["runs"],
    response_model=TaskRuns,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(404, 422),
    summary="Every run (attempt) of a task, with its error and traceback",
)
async def get_runs(task_id: TaskIdPath, request: Request, tasks: TasksDep) -> Response:
    """Every run of the task, by attempt."""
    tid = parse_task_id(task_id)
    await check_task_reach(tasks, tid, reach_of(request))
    return json_response({"task_id": str(tid), "runs": await tasks.runs(tid)})


BULK_SCOPES = {
    BulkAction.RETRY: "tasks:write",
    BulkAction.REPLAY: "dlq:replay",
    BulkAction.CANCEL: "tasks:cancel",
    BulkAction.DELETE: "tasks:write",
}
"""The scope a real bulk action needs: the same as the action on one task."""


_TIME = {"type": "string", "format": "date-time"}
SEARCH_PARAMETERS = [
    query_parameter(
        "status",
        {"type": "array", "items": {"$ref": "#/components/schemas/TaskStatus"}},  # the shared enum of Task
        "Task status; repeat it or separate by commas for several",
        style="form",
        explode=True,
    ),
    query_parameter("queue", {"type": "string", "pattern": NAME_REGEX}, "Tasks of this queue"),
    query_parameter("name", {"type": "string", "pattern": NAME_REGEX}, "Tasks of this task name"),
    query_parameter("tenant_id", {"type": "string", "maxLength": 128}, "Tasks of this tenant"),
    query_parameter("dedup_key", {"type": "string", "maxLength": 512}, "The task with this dedup key"),
    query_parameter("error", {"type": "string", "maxLength": 200}, "Text in the latest run's error, any case"),
    query_parameter("created_after", _TIME, "Created at or after (RFC 3339 with an offset)"),
    query_parameter("created_before", _TIME, "Created before (RFC 3339 with an offset)"),
    query_parameter("finished_after", _TIME, "Finished (completed, failed or cancelled) at or after"),
    query_parameter("finished_before", _TIME, "Finished before"),
    query_parameter("order", {"type": "string", "enum": ["desc", "asc"], "default": "desc"}, "Newest or oldest first"),
    query_parameter("limit", {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}, "Tasks per page"),
    query_parameter("cursor", {"type": "string"}, "The previous page's next_cursor"),
    query_parameter(
        "payload.{path}",
        {"type": "string"},
        "Not a literal name: payload.customer.id=42 keeps tasks whose payload contains that value (a JSON "
        'number, true, false, null or "string", else the text); any number of them',
    ),
]
"""The search's query parameters for the OpenAPI document (the route parses them itself, repeated names kept)."""


@router.get(
    "/api/v1/tasks",
    operation_id="searchTasks",
    tags=["tasks"],
    response_model=TaskPage,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(422),
    openapi_extra={"parameters": SEARCH_PARAMETERS},
    summary="Find tasks by status, queue, name, tenant, dedup key, error, times and payload fields; keyset pages",
)
async def search_tasks(request: Request, stores: StoresDep) -> Response:
    """Newest first (or ``order=asc``), up to ``limit`` (1..500, 50) per page, without payloads or results.

    Filters: ``status`` (repeated or comma-separated), ``queue``, ``name``, ``tenant_id``, ``dedup_key``,
    ``error`` (in the latest run's error, any case), ``created_after``/``_before``,
    ``finished_after``/``_before`` (RFC 3339), and ``payload.<field>[.<field>…]=<value>``
    (the payload contains it; a JSON number, true, false, null or "string", else the text).
    Answer: ``{"tasks", "next_cursor", "partial"}``; pass ``cursor`` for the next page.
    """
    f, order, start, limit = parse_search(request.query_params.multi_items())
    narrowed = reach_of(request).narrow(f)
    if narrowed is None:  # a tenant or queue beyond the key's: as a search that matches nothing
        return json_response({"tasks": [], "next_cursor": None, "partial": False})
    return json_response(await search(stores.pg, narrowed, order, start, limit))


@router.post(
    "/api/v1/tasks:bulk",
    operation_id="bulkTasks",
    tags=["operations"],
    response_model=BulkDryRun,
    dependencies=[Depends(require("tasks:read"))],
    responses={
        202: {"description": "A real run: the operation, started (`Location` names it)", "model": Operation},
        **problem_responses(400, 413, 422),
    },
    openapi_extra=body_schema(BulkRequest),
    summary="Retry, replay, cancel or delete every task a filter matches (a dry run counts them first)",
)
async def bulk(request: Request, stores: StoresDep) -> Response:
    """A dry run answers 200 ``{"matched", "complete", "sample"}`` at once; a real run answers 202 with the
    operation (``GET /api/v1/operations/{id}`` follows it) and runs in the background in batches.

    Counting needs ``tasks:read``; acting needs the action's own scope (:data:`BULK_SCOPES`)."""
    req = await parse_body(request, BulkRequest)
    f = parse_filter(req.filter)
    if req.reason is not None:
        check_json(req.reason, "reason")
    reach = reach_of(request)
    narrowed = reach.narrow(f)
    audit.note(reason=req.reason, read_only=req.dry_run, details={"action": req.action.value, "filter": req.filter})
    if narrowed is not None and narrowed.tenant_id is not None:  # one tenant's tasks: in its audit log too
        audit.note(tenant_id=narrowed.tenant_id)
    if req.dry_run:
        counted = NOTHING_MATCHED if narrowed is None else await bulk_dry_run(stores.pg, narrowed)
        return json_response({"action": req.action.value, **counted})
    demand(request, BULK_SCOPES[req.action])
    if req.reason is None or not req.reason.strip():
        raise InvalidTaskError(
            "reason", "required to act (not for a dry run): kept with the operation and in the audit log"
        )
    async with stores.pg.changing() as pg:
        op = await bulk_start(pg, req, reach)
        audit.note(resource_type="operation", resource_id=op["operation_id"])
    log.info("operation_started", operation_id=op["operation_id"], action=op["action"], reason=req.reason)
    return json_response(op, 202, headers={"Location": f"/api/v1/operations/{op['operation_id']}"})


NOTHING_MATCHED = {"matched": 0, "complete": True, "sample": []}


@router.get(
    "/api/v1/operations/{operation_id}",
    operation_id="getOperation",
    tags=["operations"],
    response_model=Operation,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(404, 422),
    summary="A bulk operation's progress: done, skipped, status",
)
async def get_operation(operation_id: OperationIdPath, request: Request, stores: StoresDep) -> Response:
    """The operation (404 when no operation has this id)."""
    try:
        op_id = uuid.UUID(operation_id)
    except ValueError:
        raise InvalidTaskError("operation_id", "must be a UUID") from None
    row = await stores.pg.operations.get(op_id)
    if row is None or not reach_of(request).covers(row["tenant_id"], row["queues"]):
        return problem(404, "Operation not found", f"no operation has id {op_id}")
    return json_response(operation_to_dict(row))


@router.post(
    "/api/v1/tasks/{task_id}/cancel",
    operation_id="cancelTask",
    tags=["tasks"],
    response_model=Cancellation,
    dependencies=[Depends(require("tasks:cancel"))],
    responses={
        202: {
            "description": "A running task: its worker is asked to cancel it (`cancel_requested: true`)",
            "model": Cancellation,
        },
        **problem_responses(404, 409, 422),
    },
    summary="Cancel a task: a queued one never runs (200), a running one is cancelled on its worker (202)",
)
async def cancel_task(task_id: TaskIdPath, request: Request, tasks: TasksDep) -> Response:
    """Cancel a queued task now, or ask the worker of a running one to cancel it (409 when finished)."""
    tid = parse_task_id(task_id)
    await check_task_reach(tasks, tid, reach_of(request))
    done = await tasks.cancel(tid)
    if done.status == TaskStatus.CANCELLED:
        return json_response({"task_id": str(tid), "status": "cancelled"})
    return json_response({"task_id": str(tid), "status": "running", "cancel_requested": True}, 202)


class RetryRequest(BaseModel):
    """Body of ``POST /api/v1/tasks/{task_id}/retry`` (optional): a new priority or queue."""

    model_config = ConfigDict(extra="forbid")

    priority: StrictInt | None = Field(default=None, ge=0, le=1000)
    queue_name: str | None = Field(default=None, pattern=NAME_REGEX)


@router.post(
    "/api/v1/tasks/{task_id}/retry",
    operation_id="retryTask",
    tags=["tasks"],
    response_model=RetriedTask,
    dependencies=[Depends(require("tasks:write"))],
    responses=problem_responses(400, 404, 409, 413, 422),
    openapi_extra=body_schema(RetryRequest, required=False),
    summary="Queue a failed or cancelled task again with a fresh retry budget (409 for any other state)",
)
async def retry_task(task_id: TaskIdPath, request: Request, tasks: TasksDep) -> Response:
    """Move a failed or cancelled task back to queued, due now; optionally to a new priority or queue."""
    tid = parse_task_id(task_id)
    req = await parse_body(request, RetryRequest, optional=True)
    reach = reach_of(request)
    await check_task_reach(tasks, tid, reach)
    if req.queue_name is not None and not reach.sees_queue(req.queue_name):
        raise BeyondReachError(
            "queue_name", f"this key may use the queues {', '.join(sorted(reach.queues or ()))}; not {req.queue_name!r}"
        )
    done = await tasks.retry(tid, req.priority, req.queue_name)
    return json_response(
        {
            "task_id": str(tid),
            "status": done.status,
            "queue_name": done.queue,
            "priority": done.priority,
            "previous_status": done.previous_status,
        }
    )


@router.delete(
    "/api/v1/tasks/{task_id}",
    operation_id="deleteTask",
    tags=["tasks"],
    dependencies=[Depends(require("tasks:write"))],
    responses=problem_responses(404, 409, 422),
    status_code=204,
    openapi_extra={"parameters": [REASON_PARAMETER]},
    summary="Delete a finished task and its runs, saying why (409 while it is queued or running)",
)
async def delete_task(task_id: TaskIdPath, request: Request, tasks: TasksDep) -> Response:
    """Delete a completed, failed or cancelled task with every run (204, no body).

    Deleting cannot be undone, so it needs ``?reason=``, kept in the audit log (422 without one)."""
    tid = parse_task_id(task_id)
    audit.note(reason=required_reason(request, "delete a task"))
    await check_task_reach(tasks, tid, reach_of(request))
    await tasks.delete(tid)
    return Response(status_code=204)
