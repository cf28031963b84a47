"""Queue routes: the queues and their state, pausing and resuming one; its dead-letter queue, and replaying from it."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.responses import Response

from taskmesh.api.auth import check_queue_reach, platform_wide, reach_of, require
from taskmesh.api.deps import (
    QueuePath,
    StoresDep,
    TasksDep,
    UndocumentedQuery,
    body_schema,
    check_queue,
    json_response,
    parse_body,
    query_parameter,
)
from taskmesh.api.problems import problem_responses
from taskmesh.api.schemas import DeadLetters, History, Queue, QueueList, QueuePause, Replayed
from taskmesh.errors import InvalidTaskError
from taskmesh.observability.logs import get_logger
from taskmesh.security import audit
from taskmesh.tasks.history import WINDOWS, history
from taskmesh.tasks.queue_overview import known_queues, overview
from taskmesh.tasks.records import pause_to_dict
from taskmesh.tasks.validation import NAME_REGEX, StrictInt, check_json

log = get_logger("taskmesh.api")

router = APIRouter()

DLQ_COUNT_MAX = 1000
PAUSE_REASON_MAX = 500


@router.get(
    "/api/v1/queues",
    operation_id="listQueues",
    tags=["queues"],
    response_model=QueueList,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(),
    summary="Every queue with tasks, a pause or a live instance serving it: depths, age, workers, runs per minute",
)
async def list_queues(request: Request, stores: StoresDep) -> Response:
    """Up to 1,000 queues by name, each as ``GET /api/v1/queues/{queue}`` answers it (a key bound to queues:
    those; a key bound to a tenant is refused, as the depths count every tenant's tasks)."""
    platform_wide(request, "tasks:read", "the queue list")
    reach = reach_of(request)
    queues = [q for q in await known_queues(stores) if reach.sees_queue(q)]
    return json_response({"queues": await overview(stores, queues)})


@router.get(
    "/api/v1/queues/{queue}",
    operation_id="getQueue",
    tags=["queues"],
    response_model=Queue,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(422),
    summary="One queue: depths by state, age, pause, workers, runs per minute",
)
async def get_queue(queue: QueuePath, request: Request, stores: StoresDep) -> Response:
    """One queue (any valid name: a queue nobody has used answers with zeros)."""
    check_queue(queue)
    platform_wide(request, "tasks:read", "a queue's overview")
    check_queue_reach(request, queue)
    [answer] = await overview(stores, [queue])
    return json_response(answer)


class PauseRequest(BaseModel):
    """Body of ``POST /api/v1/queues/{queue}/pause`` (optional): why, for the other operators."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, min_length=1, max_length=PAUSE_REASON_MAX)


@router.post(
    "/api/v1/queues/{queue}/pause",
    operation_id="pauseQueue",
    tags=["queues"],
    response_model=QueuePause,
    dependencies=[Depends(require("queues:admin"))],
    responses=problem_responses(400, 413, 422),
    openapi_extra=body_schema(PauseRequest, required=False),
    summary="Pause a queue: no instance claims its tasks until it is resumed (enqueue goes on)",
)
async def pause_queue(queue: QueuePath, request: Request, stores: StoresDep) -> Response:
    """Pause ``queue`` (any valid name: a queue may be paused before it has tasks or workers).

    Persisted in PostgreSQL: every instance's claim refuses the queue's tasks from the commit on,
    also after restarts. Running runs finish. Pausing a paused queue keeps its ``paused_at``.
    """
    check_queue(queue)
    platform_wide(request, "queues:admin", "pausing a queue")
    check_queue_reach(request, queue)
    req = await parse_body(request, PauseRequest, optional=True)
    if req.reason is not None:
        check_json(req.reason, "reason")
    audit.note(reason=req.reason)
    async with stores.pg.changing() as pg:
        row = await pg.queues.pause(queue, req.reason)
    log.info("queue_paused", queue=queue, reason=req.reason)
    return json_response(pause_to_dict(queue, row))


@router.post(
    "/api/v1/queues/{queue}/resume",
    operation_id="resumeQueue",
    tags=["queues"],
    response_model=QueuePause,
    dependencies=[Depends(require("queues:admin"))],
    responses=problem_responses(422),
    summary="Resume a paused queue (a running one stays running)",
)
async def resume_queue(queue: QueuePath, request: Request, stores: StoresDep) -> Response:
    """Resume ``queue``: instances serving it claim again within a second."""
    check_queue(queue)
    platform_wide(request, "queues:admin", "resuming a queue")
    check_queue_reach(request, queue)
    async with stores.pg.changing() as pg:
        await pg.queues.resume(queue)
    log.info("queue_resumed", queue=queue)
    return json_response(pause_to_dict(queue, None))


class ReplayRequest(BaseModel):
    """Body of ``POST /api/v1/queues/{queue}/dlq/replay``: the oldest ``count``, or the given ``ids``."""

    model_config = ConfigDict(extra="forbid")

    count: StrictInt | None = Field(default=None, ge=1, le=DLQ_COUNT_MAX)
    ids: list[uuid.UUID] | None = Field(default=None, min_length=1, max_length=DLQ_COUNT_MAX)
    override_priority: StrictInt | None = Field(default=None, ge=0, le=1000)

    @model_validator(mode="after")
    def _count_or_ids(self) -> ReplayRequest:
        if self.count is not None and self.ids is not None:
            raise ValueError("give count (the oldest) or ids (those tasks), not both")
        return self


DLQ_COUNT_PARAMETER = query_parameter(
    "count", {"type": "integer", "minimum": 1, "maximum": DLQ_COUNT_MAX, "default": 50}, "Most tasks listed"
)


@router.get(
    "/api/v1/queues/{queue}/dlq",
    operation_id="listDeadLetters",
    tags=["dlq"],
    response_model=DeadLetters,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(422),
    openapi_extra={"parameters": [DLQ_COUNT_PARAMETER]},
    summary="Dead-lettered tasks of a queue, oldest first",
)
async def get_dlq(queue: QueuePath, request: Request, tasks: TasksDep, count: UndocumentedQuery = None) -> Response:
    """Up to ``count`` (1..1000) dead-lettered tasks of ``queue`` (of the key's tenant, when it has one)."""
    check_queue(queue)
    check_queue_reach(request, queue)
    count = "50" if count is None else count
    if not (count.isascii() and count.isdigit()) or not 1 <= int(count) <= DLQ_COUNT_MAX:
        raise InvalidTaskError("count", f"must be an integer between 1 and {DLQ_COUNT_MAX}")
    items = await tasks.dead_letters(queue, int(count), reach_of(request).tenant_id)
    return json_response({"queue": queue, "count": len(items), "tasks": items})


@router.post(
    "/api/v1/queues/{queue}/dlq/replay",
    operation_id="replayDeadLetters",
    tags=["dlq"],
    response_model=Replayed,
    dependencies=[Depends(require("dlq:replay"))],
    responses=problem_responses(400, 413, 422),
    openapi_extra=body_schema(ReplayRequest),
    summary="Replay dead-lettered tasks, oldest first; priority changes only with override_priority",
)
async def replay(queue: QueuePath, request: Request, tasks: TasksDep) -> Response:
    """Move up to ``count`` (default 1) dead-lettered tasks, or the given ``ids``, back to ready with a fresh
    retry budget. ``not_replayed``: the given ids that are not dead-lettered in this queue."""
    check_queue(queue)
    check_queue_reach(request, queue)
    req = await parse_body(request, ReplayRequest, optional=True)
    tenant = reach_of(request).tenant_id
    audit.note(details={"count": req.count, "ids": None if req.ids is None else [str(i) for i in req.ids[:10]]})
    ids = await tasks.replay(queue, req.count or 1, req.override_priority, ids=req.ids, tenant_id=tenant)
    answer: dict[str, Any] = {"queue": queue, "count": len(ids), "replayed": ids}
    if req.ids is not None:
        done = set(ids)
        answer["not_replayed"] = [str(i) for i in dict.fromkeys(req.ids) if str(i) not in done]
    return json_response(answer)


@router.get(
    "/api/v1/history",
    operation_id="getHistory",
    tags=["queues"],
    response_model=History,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(422),
    openapi_extra={
        "parameters": [
            query_parameter("window", {"type": "string", "enum": list(WINDOWS), "default": "hour"}, "The span"),
            query_parameter("queue", {"type": "string", "pattern": NAME_REGEX}, "One queue (else every queue summed)"),
        ]
    },
    summary="Runs, waits and backlog per minute (last hour) or per five minutes (last day), from the rollup",
)
async def get_history(
    request: Request, stores: StoresDep, window: UndocumentedQuery = None, queue: UndocumentedQuery = None
) -> Response:
    """``window`` ``hour`` (60 points of a minute) or ``day`` (288 of five minutes), of ``queue`` or of
    every queue summed (a key bound to a tenant is refused: the counts are every tenant's)."""
    window = "hour" if window is None else window
    if window not in WINDOWS:
        raise InvalidTaskError("window", f"must be one of {', '.join(WINDOWS)}, not {window[:40]!r}")
    if queue is not None:
        check_queue(queue)
    platform_wide(request, "tasks:read", "the queues' history", every_queue=queue is None)
    if queue is not None:
        check_queue_reach(request, queue)
    return json_response(await history(stores.pg, window, queue))
