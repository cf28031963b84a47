"""Limit routes: the task limits in force with what each holds now, and setting one at run time.

Reads take ``tasks:read``; a key bound to a tenant sees only the limits counted per tenant
(``key = "tenant_id"``), and of each only its own tenant's counter. Setting or unsetting a limit takes
``queues:admin`` and is audited (``limit.set``, ``limit.unset``); a limit's numbers hold for every
tenant, so a tenant-bound key cannot change one, and a queue-bound key only a limit of one of its
queues. A limit set here holds on every instance within a second (``limits/live.py``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from starlette.responses import Response

from taskmesh.api.auth import caller, check_queue_reach, platform_wide, reach_of, require
from taskmesh.api.deps import StoresDep, TasksDep, body_schema, json_response, parse_body
from taskmesh.api.problems import problem_responses
from taskmesh.api.schemas import Limit, LimitList
from taskmesh.errors import LimitNotFoundError, PermissionDeniedError
from taskmesh.limits import live
from taskmesh.limits.book import key_value
from taskmesh.limits.settings import LIMIT_NAME, LimitSettings, check_limit
from taskmesh.limits.usage import describe, usage
from taskmesh.observability.logs import get_logger
from taskmesh.security import audit
from taskmesh.store import Stores
from taskmesh.tasks.queue_overview import known_queues
from taskmesh.tasks.tasks import Tasks

log = get_logger("taskmesh.api")

router = APIRouter()

LimitPath = Annotated[
    str,
    Path(
        description="The limit's name: lowercase letters, digits, _ and -, at most 64.",
        json_schema_extra={"pattern": LIMIT_NAME.pattern},
    ),
]
"""A limit's name in the path: typed for the OpenAPI document, checked by :func:`check_limit` (exact 422)."""


async def _answer(request: Request, stores: Stores, tasks: Tasks, name: str) -> dict[str, Any]:
    """One limit with its usage, as the caller may see it."""
    tenant = reach_of(request).tenant_id
    settings = tasks.limits.limits[name]
    only = f"{name}:{key_value(tenant)}" if tenant is not None and settings.key == "tenant_id" else None
    queues = [q for q in await known_queues(stores) if reach_of(request).sees_queue(q)]
    return {**describe(tasks.limits, name), "usage": await usage(stores.redis, tasks.limits, name, queues, only)}


def _visible(request: Request, tasks: Tasks, name: str) -> bool:
    """Whether the caller may see limit ``name``: a tenant-bound key only a limit counted per tenant."""
    return reach_of(request).tenant_id is None or tasks.limits.limits[name].key == "tenant_id"


@router.get(
    "/api/v1/limits",
    operation_id="listLimits",
    tags=["limits"],
    response_model=LimitList,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(),
    summary="The task limits in force, each with what it holds now per queue and key",
)
async def list_limits(request: Request, stores: StoresDep, tasks: TasksDep) -> Response:
    """Every limit in force by name (configured, or set at run time: ``source``), with ``usage``: per queue and
    key, the runs holding its slots, the tasks waiting for it and a back-off's end."""
    await live.refresh(tasks.limits, stores.pg)
    names = [n for n in sorted(tasks.limits.limits) if _visible(request, tasks, n)]
    return json_response({"limits": [await _answer(request, stores, tasks, n) for n in names]})


@router.get(
    "/api/v1/limits/{limit}",
    operation_id="getLimit",
    tags=["limits"],
    response_model=Limit,
    dependencies=[Depends(require("tasks:read"))],
    responses=problem_responses(404, 422),
    summary="One task limit and what it holds now",
)
async def get_limit(limit: LimitPath, request: Request, stores: StoresDep, tasks: TasksDep) -> Response:
    """One limit in force, as ``GET /api/v1/limits`` lists it (404 for a name no limit has)."""
    check_limit(limit)
    await live.refresh(tasks.limits, stores.pg)
    if limit not in tasks.limits.limits or not _visible(request, tasks, limit):
        raise LimitNotFoundError(limit)
    return json_response(await _answer(request, stores, tasks, limit))


def _may_change(request: Request, settings: LimitSettings | None, what: str) -> None:
    """Refuse a tenant-bound key, and a queue-bound one a limit beyond its queues."""
    platform_wide(request, "queues:admin", what)
    if caller(request).queues is None or settings is None:
        return
    if settings.queue is None:
        raise PermissionDeniedError("queues:admin", f"{what} spans every queue; this key is bound to some queues")
    check_queue_reach(request, settings.queue)


@router.put(
    "/api/v1/limits/{limit}",
    operation_id="setLimit",
    tags=["limits"],
    response_model=Limit,
    dependencies=[Depends(require("queues:admin"))],
    responses=problem_responses(400, 413, 422),
    openapi_extra=body_schema(LimitSettings),
    summary="Set a task limit at run time: it overrides the configured one of its name, on every instance",
)
async def set_limit(limit: LimitPath, request: Request, stores: StoresDep, tasks: TasksDep) -> Response:
    """Set limit ``limit`` (``concurrency`` and/or ``rate`` with ``burst``, selecting by ``queue``, ``task``,
    ``key``). Every instance holds its keys to the new numbers within a second; a limit that selects
    differently holds the tasks created from then on (a task's limit keys are decided when it is created)."""
    check_limit(limit)
    settings = await parse_body(request, LimitSettings)
    _may_change(request, settings, "setting a limit")
    existing = tasks.limits.limits.get(limit)
    _may_change(request, existing, "changing this limit")
    audit.note(details={"limit": limit, **settings.model_dump(exclude_none=True)})
    await live.set_limit(tasks.limits, stores.pg, limit, settings, caller(request).key_id)
    return json_response(await _answer(request, stores, tasks, limit))


@router.delete(
    "/api/v1/limits/{limit}",
    operation_id="unsetLimit",
    tags=["limits"],
    status_code=204,
    response_class=Response,
    dependencies=[Depends(require("queues:admin"))],
    responses=problem_responses(404, 422),
    summary="Drop a limit set at run time: the configured one of its name, if any, holds again",
)
async def unset_limit(limit: LimitPath, request: Request, stores: StoresDep, tasks: TasksDep) -> Response:
    """Remove what ``PUT`` set for ``limit`` (204); the configured limit of that name, if any, holds again on
    every instance within a second. 404 when nothing was set at run time under that name."""
    check_limit(limit)
    await live.refresh(tasks.limits, stores.pg)
    _may_change(request, tasks.limits.limits.get(limit), "changing this limit")
    if not await live.unset_limit(tasks.limits, stores.pg, limit):
        raise LimitNotFoundError(limit, f"no limit named {limit!r} was set at run time")
    return Response(status_code=204)
