"""Workflow routes: submit a graph (or a batch of them), read one, list them, cancel one, retry one from failure.

Scopes are the tasks': submit, submit a batch and retry ``tasks:write``, cancel ``tasks:cancel``, read ``tasks:read``.
A tenant-bound key submits into its tenant (another tenant named in the body: 403) and sees only its
tenant's workflows: another's answers 404, as a missing one does. A queue-bound key submits only
nodes on its queues and sees only workflows whose every node is on them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from taskmesh.api.auth import reach_of, require
from taskmesh.api.deps import (
    BATCH_MAX,
    StateDep,
    atomic_refusal,
    batch_items,
    body_schema,
    is_name,
    json_response,
    parse_body,
    query_parameter,
    read_json,
)
from taskmesh.api.problems import problem_responses
from taskmesh.api.schemas.workflows import (
    WorkflowBatchCreated,
    WorkflowCancelled,
    WorkflowCreated,
    WorkflowDetail,
    WorkflowPage,
    WorkflowRetried,
)
from taskmesh.api.state import AppState
from taskmesh.errors import BeyondReachError, InvalidTaskError, NotReadyError, WorkflowNotFoundError
from taskmesh.security import audit
from taskmesh.security.tenancy import Reach
from taskmesh.tasks.states import WorkflowStatus
from taskmesh.tasks.validation import NAME_REGEX, TENANT_CHARACTERS, TaskSpec, check_json
from taskmesh.workflows.spec import WorkflowLimits, WorkflowSpec, parse_workflow
from taskmesh.workflows.workflows import PAGE_MAX, Prepared, PrepareMemo, Workflows

router = APIRouter()

"""Most workflows of one ``POST /api/v1/workflows:batch`` (their nodes are bounded by ``workflow_max_nodes``)."""

WorkflowIdPath = Annotated[str, Path(description="A workflow's id (UUID).", json_schema_extra={"format": "uuid"})]


def get_workflows(state: StateDep) -> Workflows:
    """The workflow facade.

    :raises NotReadyError: the stores have not answered yet (503).
    """
    if state.workflows is None:
        raise NotReadyError()
    return state.workflows


WorkflowsDep = Annotated[Workflows, Depends(get_workflows)]


def parse_workflow_id(raw: str) -> uuid.UUID:
    """:raises InvalidTaskError: not a UUID (422 naming ``workflow_id``)."""
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise InvalidTaskError("workflow_id", "must be a UUID") from None


async def reached(workflows: Workflows, workflow_id: uuid.UUID, reach: Reach) -> None:
    """Refuse a workflow beyond the caller's reach as a missing one.

    :raises WorkflowNotFoundError: none has this id, or it is another tenant's or on a queue beyond the key's.
    """
    tenant, queues = await workflows.owner(workflow_id)
    if not (reach.tenant_id is None or tenant == reach.tenant_id) or not all(reach.sees_queue(q) for q in queues):
        raise WorkflowNotFoundError(str(workflow_id))


def bind_to_reach(spec: WorkflowSpec, reach: Reach, workflows: Workflows, field_prefix: str = "") -> WorkflowSpec:
    """The workflow in the caller's tenant (filled in when the body has none), every node on its queues.

    :param field_prefix: put before a refused field's name (``workflows[3].`` in a batch).
    :raises BeyondReachError: another tenant, or a node's queue beyond the key's (403 naming the field).
    """
    if reach.tenant_id is not None:
        if spec.tenant_id is None:
            spec = spec.model_copy(update={"tenant_id": reach.tenant_id})
        elif spec.tenant_id != reach.tenant_id:
            raise BeyondReachError(
                f"{field_prefix}tenant_id",
                f"this key is bound to tenant {reach.tenant_id!r}; it cannot create workflows of tenant "
                f"{spec.tenant_id!r}",
            )
    if reach.queues is not None:
        named = [(f"nodes[{i}].queue_name", n.task, n.queue_name) for i, n in enumerate(spec.nodes)]
        named += [
            (f"{k}.queue_name", c.task, c.queue_name)
            for k, c in (("on_failure", spec.on_failure), ("finally", spec.finally_))
            if c
        ]
        for where, task, queue in named:
            resolved = workflows.tasks.queue_for(task, queue or spec.queue_name)
            if not reach.sees_queue(resolved):
                raise BeyondReachError(field_prefix + where, f"this key cannot create tasks on queue {resolved!r}")
    return spec


@router.post(
    "/api/v1/workflows",
    operation_id="createWorkflow",
    tags=["workflows"],
    dependencies=[Depends(require("tasks:write"))],
    responses={
        200: {
            "description": "The dedup_key repeats: the existing workflow, `deduplicated: true`",
            "model": WorkflowCreated,
        },
        **problem_responses(400, 403, 413, 422),
    },
    status_code=201,
    response_model=WorkflowCreated,
    openapi_extra=body_schema(WorkflowSpec),
    summary="Submit a workflow: a graph of tasks (200 with the existing workflow when dedup_key repeats)",
)
async def create_workflow(request: Request, workflows: WorkflowsDep, state: StateDep) -> Response:
    """Validate the graph and store the workflow, its nodes, edges and tasks in one transaction; push its roots.

    422 names the node's field: a cycle (naming it), an unknown dep, a duplicate id, more nodes than
    ``workflow_max_nodes``, a payload its handler's model refuses.
    """
    data = await read_json(request, "nodes")
    spec = parse_workflow(data, workflows.limits)
    await workflows.tasks.learn()
    spec = bind_to_reach(spec, reach_of(request), workflows)
    await check_quotas(state, workflows, [spec])
    result = await workflows.submit(spec)
    if not result.created:
        return json_response(result.to_dict(), 200)
    return json_response(result.to_dict(), 201, headers={"Location": f"/api/v1/workflows/{result.workflow_id}"})


async def check_quotas(
    state: AppState, workflows: Workflows, specs: Sequence[WorkflowSpec], prefixes: Sequence[str] = ("",)
) -> None:
    """Hold the workflows' tenants' quotas (payload bytes, enqueue rate), counting their nodes' tasks
    all together.

    :param prefixes: each spec's field prefix (``workflows[3].`` in a batch).
    :raises QuotaExceededError: naming the quota, the tenant and the node (``nodes[2].payload``).
    """
    tasks: list[TaskSpec] = []
    fields: list[str] = []
    for spec, prefix in zip(specs, prefixes, strict=True):
        if spec.tenant_id is None:
            continue
        for i, n in enumerate(spec.nodes):
            tasks.append(TaskSpec.model_construct(name=n.task, payload=n.payload or {}, tenant_id=spec.tenant_id))
            fields.append(f"{prefix}nodes[{i}].")
    if tasks:
        await state.quotas.check(workflows.pg, workflows.tasks.redis, tasks, fields)


class WorkflowBatchRequest(BaseModel):
    """Body of ``POST /api/v1/workflows:batch``: up to 1,000 workflows, their nodes at most
    ``workflow_max_nodes`` in all; ``atomic`` stores all or none."""

    model_config = ConfigDict(extra="forbid")

    workflows: list[WorkflowSpec] = Field(
        min_length=1, max_length=BATCH_MAX, description="Each the body of POST /api/v1/workflows."
    )
    atomic: bool = Field(default=False, description="Store every workflow or none (422 naming the first refused).")


def _parse_batch(data: Any, limits: WorkflowLimits) -> tuple[list[WorkflowSpec], list[int], list[dict[str, Any]], bool]:
    """The batch's valid workflows with their indexes, a refused item's result at its index, and ``atomic``.

    :raises InvalidTaskError: the batch as a whole is refused: not an object, an unknown field, no list of
        1 to 1,000 workflows, more nodes in all than ``workflow_max_nodes``.
    """
    items, atomic = batch_items(data, "workflows")
    total = sum(len(w["nodes"]) for w in items if isinstance(w, dict) and isinstance(w.get("nodes"), list))
    if total > limits.max_nodes:
        raise InvalidTaskError(
            "workflows",
            f"{total} nodes in all, more than the workflow_max_nodes setting ({limits.max_nodes}): "
            "send smaller batches",
        )
    specs: list[WorkflowSpec] = []
    positions: list[int] = []
    results: list[dict[str, Any]] = [{} for _ in items]
    for i, item in enumerate(items):
        try:
            specs.append(parse_workflow(item, limits))
            positions.append(i)
        except InvalidTaskError as exc:
            results[i] = _rejected(i, exc)
    return specs, positions, results, atomic


def _rejected(index: int, exc: InvalidTaskError) -> dict[str, Any]:
    return {
        "index": index,
        "status": "rejected",
        "errors": [{"field": f"workflows[{index}].{f}", "message": m} for f, m in exc.errors],
    }


@router.post(
    "/api/v1/workflows:batch",
    operation_id="createWorkflowBatch",
    tags=["workflows"],
    dependencies=[Depends(require("tasks:write"))],
    response_model=WorkflowBatchCreated,
    responses=problem_responses(400, 403, 413, 422),
    openapi_extra=body_schema(WorkflowBatchRequest),
    summary="Submit up to 1,000 workflows in one transaction; each item's outcome is reported",
)
async def create_workflow_batch(request: Request, workflows: WorkflowsDep, state: StateDep) -> Response:
    """Store the valid workflows of a batch (all or none when ``atomic``) in one transaction of a few
    statements, push their roots, and report each item: ``created``, ``deduplicated`` (its
    ``dedup_key`` is taken, or repeats an earlier item's: that workflow's id and tasks) or
    ``rejected`` (``errors`` naming ``workflows[i].nodes[j].<field>``).

    Each item is checked as ``POST /api/v1/workflows`` checks its body; its tenant and queues as that
    route's (a key's other tenant or queue refuses the whole batch, 403 naming the item's field); the
    tenants' quotas count the tasks of every item. 422 naming ``workflows``: more than 1,000 workflows,
    or more nodes in all than ``workflow_max_nodes`` (the bound of one transaction, as of one workflow).
    """
    data = await read_json(request, "workflows")
    specs, positions, results, atomic = _parse_batch(data, workflows.limits)
    await workflows.tasks.learn()
    reach = reach_of(request)
    specs = [bind_to_reach(s, reach, workflows, f"workflows[{i}].") for s, i in zip(specs, positions, strict=True)]
    memo = PrepareMemo()
    prepared: list[Prepared] = []
    kept: list[int] = []
    for spec, i in zip(specs, positions, strict=True):
        try:
            prepared.append(workflows.prepare(spec, memo=memo))
            kept.append(i)
        except InvalidTaskError as exc:
            results[i] = _rejected(i, exc)
    await check_quotas(state, workflows, [p.spec for p in prepared], [f"workflows[{i}]." for i in kept])
    rejected = len(results) - len(prepared)
    if atomic and rejected:
        return atomic_refusal(results)
    outcomes = await workflows.store(prepared) if prepared else []
    for i, outcome in zip(kept, outcomes, strict=True):
        results[i] = {
            "index": i,
            "status": "created" if outcome.created else "deduplicated",
            "workflow_id": str(outcome.workflow_id),
            "trace_id": outcome.trace_id,
            "nodes": outcome.nodes,
        }
    created = sum(1 for o in outcomes if o.created)
    return json_response(
        {"created": created, "deduplicated": len(outcomes) - created, "rejected": rejected, "results": results}
    )


@router.get(
    "/api/v1/workflows/{workflow_id}",
    operation_id="getWorkflow",
    tags=["workflows"],
    response_model=WorkflowDetail,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(404, 422),
    summary="A workflow: its state, tasks counted by state, and each node with its tasks and what it waits for",
)
async def get_workflow(workflow_id: WorkflowIdPath, request: Request, workflows: WorkflowsDep) -> Response:
    """The workflow and its nodes (a map node's task ids: its first 1,000; its counts: all)."""
    wid = parse_workflow_id(workflow_id)
    await reached(workflows, wid, reach_of(request))
    return json_response(await workflows.get(wid))


_TIME = {"type": "string", "format": "date-time"}
LIST_PARAMETERS = [
    query_parameter("name", {"type": "string", "pattern": NAME_REGEX}, "Workflows of this name"),
    query_parameter("status", {"type": "string", "enum": [s.value for s in WorkflowStatus]}, "Workflows in this state"),
    query_parameter("tenant_id", {"type": "string", "maxLength": 128}, "Workflows of this tenant"),
    query_parameter("created_after", _TIME, "Created at or after (RFC 3339 with an offset)"),
    query_parameter("created_before", _TIME, "Created before (RFC 3339 with an offset)"),
    query_parameter(
        "limit", {"type": "integer", "minimum": 1, "maximum": PAGE_MAX, "default": 50}, "Workflows per page"
    ),
    query_parameter("cursor", {"type": "string"}, "The previous page's next_cursor"),
]


@router.get(
    "/api/v1/workflows",
    operation_id="listWorkflows",
    tags=["workflows"],
    response_model=WorkflowPage,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(422),
    openapi_extra={"parameters": LIST_PARAMETERS},
    summary="Find workflows by name, state, tenant and creation time; newest first, keyset pages",
)
async def list_workflows(request: Request, workflows: WorkflowsDep) -> Response:
    """Newest first, up to ``limit`` (1..500, 50) per page: ``{"workflows", "next_cursor"}``."""
    params = _list_params(request)
    reach = reach_of(request)
    if reach.tenant_id is not None:
        if params.get("tenant_id") not in (None, reach.tenant_id):
            return json_response({"workflows": [], "next_cursor": None})  # another tenant's: nothing matches
        params["tenant_id"] = reach.tenant_id
    return json_response(await workflows.page(**params))


def _list_params(request: Request) -> dict[str, Any]:
    """The listing's filters from the query string.

    :raises InvalidTaskError: an unknown parameter, a bad status, time, limit (422 naming it).
    """
    out: dict[str, Any] = {}
    for key, value in request.query_params.items():
        if key == "name":
            if not is_name(value):
                raise InvalidTaskError("name", "must match [A-Za-z0-9_.:-]{1,128}")
            out[key] = value
        elif key == "tenant_id":
            if not 1 <= len(value) <= 128 or not value.isprintable():
                raise InvalidTaskError("tenant_id", TENANT_CHARACTERS)
            out[key] = value
        elif key == "cursor":
            if len(value) > 200:
                raise InvalidTaskError("cursor", "not a cursor this listing returned (next_cursor)")
            out[key] = value
        elif key == "status":
            if value not in {s.value for s in WorkflowStatus}:
                raise InvalidTaskError("status", f"must be one of {', '.join(s.value for s in WorkflowStatus)}")
            out[key] = value
        elif key in ("created_after", "created_before"):
            try:
                at = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                at = None
            if at is None or at.tzinfo is None:
                raise InvalidTaskError(key, "must be an RFC 3339 time with an offset")
            out[key] = at
        elif key == "limit":
            try:
                out[key] = int(value)
            except ValueError:
                raise InvalidTaskError("limit", f"must be an integer from 1 to {PAGE_MAX}") from None
        else:
            raise InvalidTaskError(key, "unknown parameter")
    return out


class CancelWorkflow(BaseModel):
    """Body of ``POST /api/v1/workflows/{id}/cancel`` (optional)."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(
        default=None, max_length=500, description="Why: kept with the workflow and in the audit log."
    )


@router.post(
    "/api/v1/workflows/{workflow_id}/cancel",
    operation_id="cancelWorkflow",
    tags=["workflows"],
    response_model=WorkflowCancelled,
    dependencies=[Depends(require("tasks:cancel"))],
    responses=problem_responses(404, 409, 413, 422),
    openapi_extra=body_schema(CancelWorkflow, required=False),
    summary="Cancel a workflow: nothing of it starts again, running tasks are stopped (idempotent)",
)
async def cancel_workflow(workflow_id: WorkflowIdPath, request: Request, workflows: WorkflowsDep) -> Response:
    """Blocked and queued tasks end ``cancelled``; running ones are stopped as a cancelled task is.

    409 for a completed or failed workflow; a cancelled one answers 200 again.
    """
    wid = parse_workflow_id(workflow_id)
    reason = (await parse_body(request, CancelWorkflow, optional=True)).reason
    if reason is not None:
        check_json(reason, "reason")
        audit.note(reason=reason)
    await reached(workflows, wid, reach_of(request))
    return json_response(await workflows.cancel(wid, reason))


@router.post(
    "/api/v1/workflows/{workflow_id}/retry",
    operation_id="retryWorkflow",
    tags=["workflows"],
    response_model=WorkflowRetried,
    dependencies=[Depends(require("tasks:write"))],
    responses=problem_responses(404, 409, 422),
    summary="Retry a failed or cancelled workflow from where it failed; completed tasks keep their results",
)
async def retry_workflow(workflow_id: WorkflowIdPath, request: Request, workflows: WorkflowsDep) -> Response:
    """Failed, cancelled and skipped tasks wait again for their deps with a fresh retry budget, in one transaction."""
    wid = parse_workflow_id(workflow_id)
    await reached(workflows, wid, reach_of(request))
    return json_response(await workflows.retry(wid))
