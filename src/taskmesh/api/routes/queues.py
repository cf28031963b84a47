"""Queue routes: the dead-letter queue of a queue, and replaying from it."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from taskmesh.api.deps import TasksDep, body_schema, check_queue, json_response, read_json
from taskmesh.errors import InvalidTaskError
from taskmesh.validation import StrictInt, field_errors

router = APIRouter()

DLQ_COUNT_MAX = 1000


class ReplayRequest(BaseModel):
    """Body of ``POST /api/v1/queues/{queue}/dlq/replay``."""

    model_config = ConfigDict(extra="forbid")

    count: StrictInt = Field(default=1, ge=1, le=DLQ_COUNT_MAX)
    override_priority: StrictInt | None = Field(default=None, ge=0, le=1000)


@router.get("/api/v1/queues/{queue}/dlq", summary="Dead-lettered tasks of a queue, oldest first")
async def get_dlq(queue: str, tasks: TasksDep, count: str = "50") -> Response:
    """Up to ``count`` (1..1000) dead-lettered tasks of ``queue``."""
    check_queue(queue)
    if not (count.isascii() and count.isdigit()) or not 1 <= int(count) <= DLQ_COUNT_MAX:
        raise InvalidTaskError("count", f"must be an integer between 1 and {DLQ_COUNT_MAX}")
    items = await tasks.dead_letters(queue, int(count))
    return json_response({"queue": queue, "count": len(items), "tasks": items})


@router.post(
    "/api/v1/queues/{queue}/dlq/replay",
    openapi_extra=body_schema(ReplayRequest),
    summary="Replay dead-lettered tasks, oldest first; priority changes only with override_priority",
)
async def replay(queue: str, request: Request, tasks: TasksDep) -> Response:
    """Move up to ``count`` dead-lettered tasks back to ready with a fresh retry budget."""
    check_queue(queue)
    data = await read_json(request, "body")
    if not isinstance(data, dict):
        raise InvalidTaskError("body", "must be a JSON object")
    try:
        req = ReplayRequest.model_validate(data)
    except ValidationError as exc:
        errors = field_errors(exc)
        raise InvalidTaskError(errors[0][0], errors[0][1], errors) from None
    ids = await tasks.replay(queue, req.count, req.override_priority)
    return json_response({"queue": queue, "count": len(ids), "replayed": ids})
