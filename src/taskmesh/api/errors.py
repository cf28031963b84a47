"""One table from error types to HTTP answers: every error the API returns is problem+json here.

| error | status | title |
| --- | --- | --- |
| ``BadJsonError`` | 400 | Malformed JSON |
| ``InvalidTaskError``, FastAPI's ``RequestValidationError`` | 422 | Invalid request |
| ``TaskNotFoundError`` | 404 | Task not found |
| ``ScheduleNotFoundError`` | 404 | Schedule not found |
| ``WorkflowNotFoundError`` | 404 | Workflow not found |
| ``LimitNotFoundError`` | 404 | Limit not found |
| ``WorkflowStateError`` | 409 | Workflow state conflict |
| ``TaskFinishedError`` | 409 | Task already finished |
| ``TaskStateError`` | 409 | Task state conflict |
| ``NotReadyError`` | 503 | Not ready |
| ``AuthenticationError`` | 401 | Unauthorized (with ``WWW-Authenticate: Bearer``) |
| ``PermissionDeniedError`` | 403 | Forbidden (names the ``scope``) |
| ``RateLimitedError`` | 429 | Too many requests (``Retry-After``, ``RateLimit-Policy``, ``RateLimit``) |
| ``BeyondReachError`` | 403 | Forbidden (names the field: a tenant or queue beyond the key's reach) |
| ``ForgedRequestError`` | 403 | Forbidden (a console session's change from elsewhere; names the header) |
| ``QuotaExceededError`` | 429, 413 for payload bytes | Quota exceeded (names the ``quota`` and tenant) |
| ``StoreError``, transient | 503 | Store unavailable (names the store) |
| ``StoreError``, a schema mismatch | 500 | Schema mismatch (names the way out; logged by the store) |
| ``StoreError``, not transient; anything else | 500 | Internal error (logged with its traceback) |
| Starlette's ``HTTPException`` (404 route; 405 method, with ``Allow``: every method of the path) | its own | its own |
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from taskmesh import __version__
from taskmesh.api.problems import invalid, problem
from taskmesh.errors import (
    AuthenticationError,
    BadJsonError,
    BeyondReachError,
    ForgedRequestError,
    InvalidTaskError,
    LimitNotFoundError,
    NotReadyError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitedError,
    ScheduleNotFoundError,
    StoreError,
    TaskFinishedError,
    TaskNotFoundError,
    TaskStateError,
    WorkflowNotFoundError,
    WorkflowStateError,
)
from taskmesh.observability.logs import get_logger
from taskmesh.tasks.storable import describe

METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")
"""The methods the API's routes use, in the order ``Allow`` lists them."""

log = get_logger("taskmesh.api")


def _bad_json(exc: Any) -> Response:
    return problem(400, "Malformed JSON", f"body: not valid JSON ({exc})", errors=[("body", "not valid JSON")])


def _invalid(exc: Any) -> Response:
    return invalid(exc.field, exc.message, exc.errors)


def _validation(exc: Any) -> Response:
    errors = [(".".join(str(p) for p in e["loc"][1:]) or "request", e["msg"]) for e in exc.errors()]
    return invalid(errors[0][0], errors[0][1], errors)


def _task_not_found(exc: Any) -> Response:
    return problem(404, "Task not found", str(exc))


def _schedule_not_found(exc: Any) -> Response:
    return problem(404, "Schedule not found", f"no schedule is named {exc.name!r}")


def _workflow_not_found(exc: Any) -> Response:
    return problem(404, "Workflow not found", str(exc))


def _limit_not_found(exc: Any) -> Response:
    return problem(404, "Limit not found", str(exc))


def _workflow_state(exc: Any) -> Response:
    return problem(409, "Workflow state conflict", str(exc))


def _finished(exc: Any) -> Response:
    return problem(409, "Task already finished", str(exc))


def _state_conflict(exc: Any) -> Response:
    return problem(409, "Task state conflict", str(exc))


def _unauthenticated(exc: Any) -> Response:
    return problem(401, "Unauthorized", str(exc), headers={"WWW-Authenticate": 'Bearer realm="taskmesh"'})


def _forbidden(exc: Any) -> Response:
    return problem(403, "Forbidden", str(exc), scope=exc.scope)


def _beyond_reach(exc: Any) -> Response:
    return problem(403, "Forbidden", str(exc), errors=[(exc.field, str(exc))])


def _quota(exc: Any) -> Response:
    status = 413 if exc.quota == "max_payload_bytes" else 429
    headers = {} if exc.retry_after is None else {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    return problem(status, "Quota exceeded", str(exc), headers=headers, quota=exc.quota, tenant_id=exc.tenant_id)


def _rate_limited(exc: Any) -> Response:
    retry = max(1, math.ceil(exc.retry_after))
    return problem(
        429,
        "Too many requests",
        str(exc),
        headers={
            "Retry-After": str(retry),
            "RateLimit-Policy": exc.policy,
            "RateLimit": f'"{exc.policy_name}";r=0;t={max(1, math.ceil(exc.reset))}',
        },
        policy=exc.policy_name,
    )


SCHEMA_MISMATCH_DETAIL = (
    "the database schema and this instance's version ({version}) disagree: run `taskmesh migrate`, "
    "or replace this instance with the release that applied the schema"
)
"""The detail of a schema mismatch's answer: the way out, never the statement or PostgreSQL's message."""


PREVIOUS_DEDUP_INDEX = "tasks_idempotency_key_key"
"""The previous release's unique index of dedup keys across tenants, until the contract step drops it."""
PREVIOUS_DEDUP_DETAIL = (
    "dedup_key: a task of another tenant has this key; until the upgrade's contract step has run"
    " (`taskmesh migrate` once no instance of the previous release runs) a dedup key is unique across tenants"
)


def schema_mismatch(exc: StoreError) -> Response:
    """500 for a statement PostgreSQL refused against its schema; its message was logged by the store's watch."""
    detail = SCHEMA_MISMATCH_DETAIL.format(version=__version__)
    return problem(500, "Schema mismatch", detail, operation=exc.operation, sqlstate=exc.sqlstate)


def _not_ready(exc: Any) -> Response:
    return problem(503, "Not ready", "the instance is still connecting to PostgreSQL and Redis")


ERROR_TABLE: list[tuple[type[Exception], Callable[[Any], Response]]] = [
    (BadJsonError, _bad_json),
    (InvalidTaskError, _invalid),
    (RequestValidationError, _validation),
    (TaskNotFoundError, _task_not_found),
    (ScheduleNotFoundError, _schedule_not_found),
    (WorkflowNotFoundError, _workflow_not_found),
    (LimitNotFoundError, _limit_not_found),
    (WorkflowStateError, _workflow_state),
    (TaskFinishedError, _finished),
    (TaskStateError, _state_conflict),
    (NotReadyError, _not_ready),
    (AuthenticationError, _unauthenticated),
    (PermissionDeniedError, _forbidden),
    (RateLimitedError, _rate_limited),
    (BeyondReachError, _beyond_reach),
    (ForgedRequestError, _beyond_reach),
    (QuotaExceededError, _quota),
]
"""Errors with a fixed answer; :class:`StoreError` and anything else are handled below."""


def install(app: FastAPI) -> None:
    """Register the table's handlers (and the store and catch-all ones) on ``app``."""
    for error_type, render in ERROR_TABLE:
        app.add_exception_handler(error_type, _handler(render))

    async def store_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StoreError)
        if exc.transient:
            return problem(503, "Store unavailable", f"{exc.store} did not answer ({exc.operation})")
        if exc.schema_mismatch:
            return schema_mismatch(exc)
        if exc.constraint == PREVIOUS_DEDUP_INDEX:
            errors = [("dedup_key", PREVIOUS_DEDUP_DETAIL)]
            return problem(409, "Dedup key in use", PREVIOUS_DEDUP_DETAIL, errors=errors)
        log.error("api_error", path=request.url.path, error=str(exc))
        return problem(500, "Internal error", "the server failed to answer; the error is logged")

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("api_error", path=request.url.path, error=describe(exc), exc_info=exc)
        return problem(500, "Internal error", "the server failed to answer; the error is logged")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not only those of the first route matched
            headers["Allow"] = ", ".join(allowed_methods(request))
        return problem(exc.status_code, str(exc.detail), str(exc.detail), headers=headers)

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(Exception, unexpected)


def allowed_methods(request: Request) -> list[str]:
    """The methods some route of the app answers at the request's path, sorted.

    Asked of the router method by method: included routers nest their routes, and a
    route's own ``methods`` would name only the first route matched.
    """
    routes = request.app.router.routes
    return [
        method
        for method in METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)
    ]


def _handler(render: Callable[[Any], Response]) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handle(_: Request, exc: Exception) -> Response:
        return render(exc)

    return handle
