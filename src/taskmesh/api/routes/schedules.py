"""Schedule routes: list, read, trigger, pause, resume."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from taskmesh.api.auth import reach_of, require
from taskmesh.api.deps import SchedulePath, SchedulesDep, StateDep, body_schema, is_name, json_response, parse_body
from taskmesh.api.problems import problem_responses
from taskmesh.api.schemas import Schedule, ScheduleFired, ScheduleList
from taskmesh.errors import ScheduleNotFoundError
from taskmesh.tasks.validation import check_json

router = APIRouter()


class TriggerRequest(BaseModel):
    """Body of ``POST /api/v1/schedules/{name}/trigger`` (optional): the fire's own idempotency key."""

    model_config = ConfigDict(extra="forbid")

    idempotency_key: str | None = Field(default=None, min_length=1, max_length=512)


def _named(name: str) -> str:
    if not is_name(name):
        raise ScheduleNotFoundError(name)  # no schedule can have this name (NUL, spaces, too long)
    return name


@router.get(
    "/api/v1/schedules",
    operation_id="listSchedules",
    tags=["schedules"],
    response_model=ScheduleList,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(),
    summary="Cron schedules: spec, zone, state, last fire and the next five fires",
)
async def list_schedules(request: Request, schedules: SchedulesDep) -> Response:
    """Every schedule in the table (a key bound to a tenant or queues: those of its tenant and queues)."""
    return json_response({"schedules": await schedules.list(reach_of(request))})


@router.get(
    "/api/v1/schedules/{name}",
    operation_id="getSchedule",
    tags=["schedules"],
    response_model=Schedule,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(404, 422),
    summary="One cron schedule",
)
async def get_schedule(name: SchedulePath, request: Request, schedules: SchedulesDep) -> Response:
    """One schedule (404 when no row has this name, or none the key reaches)."""
    return json_response(await schedules.get(_named(name), reach_of(request)))


@router.post(
    "/api/v1/schedules/{name}/trigger",
    operation_id="triggerSchedule",
    tags=["schedules"],
    response_model=ScheduleFired,
    dependencies=[Depends(require("schedules:admin"))],
    responses={
        200: {
            "description": "The idempotency_key already made a task: that task, `created: false`",
            "model": ScheduleFired,
        },
        **problem_responses(400, 404, 413, 422),
    },
    status_code=201,
    openapi_extra=body_schema(TriggerRequest, required=False),
    summary="Fire a schedule now (201; 200 when the given idempotency_key already made a task)",
)
async def trigger_schedule(name: SchedulePath, request: Request, schedules: SchedulesDep, state: StateDep) -> Response:
    """Make one task of the schedule now, also while it is paused."""
    name = _named(name)
    req = await parse_body(request, TriggerRequest, optional=True)
    if req.idempotency_key is not None:
        check_json(req.idempotency_key, "idempotency_key")
    task_id, key, created = await schedules.trigger(name, req.idempotency_key, reach_of(request))
    state.schedule_waker.wake()
    answer = {"schedule": name, "task_id": str(task_id), "idempotency_key": key, "created": created}
    if not created:
        return json_response(answer, 200)
    return json_response(answer, 201, headers={"Location": f"/api/v1/tasks/{task_id}"})


@router.post(
    "/api/v1/schedules/{name}/pause",
    operation_id="pauseSchedule",
    tags=["schedules"],
    response_model=Schedule,
    dependencies=[Depends(require("schedules:admin"))],
    responses=problem_responses(404, 422),
    summary="Pause a schedule until resumed or its config changes",
)
async def pause_schedule(name: SchedulePath, request: Request, schedules: SchedulesDep, state: StateDep) -> Response:
    """No fires until resumed."""
    answer = await schedules.set_paused(_named(name), True, reach=reach_of(request))
    state.schedule_waker.wake()
    return json_response(answer)


@router.post(
    "/api/v1/schedules/{name}/resume",
    operation_id="resumeSchedule",
    tags=["schedules"],
    response_model=Schedule,
    dependencies=[Depends(require("schedules:admin"))],
    responses=problem_responses(404, 422),
    summary="Resume a schedule; fires missed while paused are not made",
)
async def resume_schedule(name: SchedulePath, request: Request, schedules: SchedulesDep, state: StateDep) -> Response:
    """Fire again from the next due time."""
    answer = await schedules.set_paused(_named(name), False, reach=reach_of(request))
    state.schedule_waker.wake()
    return json_response(answer)
