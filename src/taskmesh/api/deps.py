"""What routes share: the instance's state as FastAPI dependencies, body parsing, path checks."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Depends, Path, Query, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from taskmesh.api.contract import BODY_MODELS, ref
from taskmesh.api.problems import problem
from taskmesh.api.state import AppState
from taskmesh.errors import BadJsonError, InvalidTaskError, NotReadyError, StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.observability.tracing import trace_id_from_headers
from taskmesh.schedules.schedules import Schedules
from taskmesh.store import Stores
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import NAME_REGEX, TaskSpec, check_json, field_errors, may_hold_big_integers

log = get_logger("taskmesh.api")

_NAME = re.compile(NAME_REGEX)
M = TypeVar("M", bound=BaseModel)
_LONG_DIGITS = re.compile(rb"[0-9]{16}")
"""A run of 16 digits: the shortest literal of an integer of at least 2^53 (9007199254740992)."""


TaskIdPath = Annotated[str, Path(description="A task's id (a UUID).", json_schema_extra={"format": "uuid"})]
"""A task id in the path: typed for the OpenAPI document, checked by :func:`parse_task_id` (exact 422)."""
OperationIdPath = Annotated[
    str, Path(description="A bulk operation's id (a UUID).", json_schema_extra={"format": "uuid"})
]
"""A bulk operation's id in the path: typed for the OpenAPI document, checked by the route."""
QueuePath = Annotated[str, Path(description="A queue's name.", json_schema_extra={"pattern": NAME_REGEX})]
"""A queue name in the path: typed for the OpenAPI document, checked by :func:`check_queue`."""
SchedulePath = Annotated[str, Path(description="A schedule's name.", json_schema_extra={"pattern": NAME_REGEX})]
"""A schedule name in the path: typed for the OpenAPI document, checked by the route."""


def get_state(request: Request) -> AppState:
    """The instance's :class:`AppState` (set on the app by ``create_app``)."""
    state: AppState = request.app.state.taskmesh
    return state


def get_tasks(state: Annotated[AppState, Depends(get_state)]) -> Tasks:
    """The task facade.

    :raises NotReadyError: the stores have not answered yet (503).
    """
    if state.tasks is None:
        raise NotReadyError()
    return state.tasks


def get_stores(state: Annotated[AppState, Depends(get_state)]) -> Stores:
    """The stores.

    :raises NotReadyError: they have not answered yet (503).
    """
    if state.stores is None:
        raise NotReadyError()
    return state.stores


def get_schedules(state: Annotated[AppState, Depends(get_state)]) -> Schedules:
    """The schedules facade.

    :raises NotReadyError: the stores have not answered yet (503).
    """
    if state.schedules is None:
        raise NotReadyError()
    return state.schedules


StateDep = Annotated[AppState, Depends(get_state)]
TasksDep = Annotated[Tasks, Depends(get_tasks)]
StoresDep = Annotated[Stores, Depends(get_stores)]
SchedulesDep = Annotated[Schedules, Depends(get_schedules)]


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON answer serialised with orjson."""
    return Response(orjson.dumps(content), status_code=status, media_type="application/json", headers=headers)


def body_schema(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON request body of ``model`` (the routes parse bodies themselves).

    The body is a ``$ref`` to the model's schema, which :func:`taskmesh.api.contract.install` puts
    among the document's components (with the models it nests).
    """
    BODY_MODELS[model.__name__] = model
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": ref(model)}}}}


async def read_json(request: Request, nested_field: str) -> Any:
    """Parse the body; nesting beyond orjson's limit is reported on ``nested_field`` (422).

    orjson reads an integer beyond 64 bits as a float, silently rounded. When the body has
    a run of 16 digits and its parse holds an integral float of at least 2^53 (the only way
    such a literal comes out), the body is parsed again by the standard library, which keeps
    integers exact, so that validation (``check_json``) refuses them naming their path; a
    genuine float such as ``1e300`` stays a float. Other bodies take orjson's parse as is.

    :raises BadJsonError: not JSON (400).
    :raises InvalidTaskError: nested too deeply (422).
    """
    body = await request.body()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        reason = str(exc).lower()
        if "depth limit" in reason or "recursion" in reason:  # orjson's own nesting limit (1024)
            raise InvalidTaskError(nested_field, "nested deeper than 64 levels") from None
        raise BadJsonError(str(exc)) from None
    if _LONG_DIGITS.search(body) is None or not may_hold_big_integers(data):
        return data
    try:
        return json.loads(body)  # valid JSON (orjson took it); only its numbers may read differently
    except RecursionError:
        raise InvalidTaskError(nested_field, "nested deeper than 64 levels") from None


BATCH_MAX = 1000
"""Most items of one batch (``tasks:batch``, ``workflows:batch``)."""


def batch_items(data: Any, field: str) -> tuple[list[Any], bool]:
    """The items of a batch body ``{field: [...], "atomic"?: bool}`` and its ``atomic`` flag.

    :param field: the list's name (``tasks``, ``workflows``), also the noun of the refusal.
    :raises InvalidTaskError: the body is not an object, names an unknown field, ``atomic`` is not a
        boolean, or ``field`` is not a list of 1 to :data:`BATCH_MAX` items.
    """
    if not isinstance(data, dict):
        raise InvalidTaskError("body", "must be a JSON object")
    unknown = sorted(set(data) - {field, "atomic"})
    if unknown:
        raise InvalidTaskError(unknown[0], "unknown field")
    items = data.get(field)
    atomic = data.get("atomic", False)
    if not isinstance(atomic, bool):
        raise InvalidTaskError("atomic", "must be true or false")
    if not isinstance(items, list) or not 1 <= len(items) <= BATCH_MAX:
        raise InvalidTaskError(field, f"must be a list of 1 to {BATCH_MAX} {field}")
    return items, atomic


def atomic_refusal(results: list[dict[str, Any]]) -> Response:
    """The 422 of an atomic batch with a refused item: the first refusal in the detail, every one in
    ``errors``, and each item's ``results`` (``not stored`` for the items that were valid).

    :param results: one per item: a refused item's result (with ``errors``), ``{}`` for a valid one.
    """
    first = next(r for r in results if r)
    return problem(
        422,
        "Invalid request",
        f"{first['errors'][0]['field']}: {first['errors'][0]['message']} (atomic batch: nothing stored)",
        errors=[(e["field"], e["message"]) for r in results if r for e in r["errors"]],
        results=[r or {"index": i, "status": "not stored"} for i, r in enumerate(results)],
    )


async def parse_body(request: Request, model: type[M], *, optional: bool = False) -> M:
    """The body as ``model``: a JSON object whose fields ``model`` validates.

    :param optional: an empty body counts as ``{}``.
    :raises BadJsonError: not JSON (400).
    :raises InvalidTaskError: not an object (``body: must be a JSON object``), or a field
        ``model`` refuses (422 naming it; every refusal in ``errors``).
    """
    data: Any = {} if optional and not (await request.body()).strip() else await read_json(request, "body")
    if not isinstance(data, dict):
        raise InvalidTaskError("body", "must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = field_errors(exc)
        raise InvalidTaskError(errors[0][0], errors[0][1], errors) from None


UndocumentedQuery = Annotated[str | None, Query(include_in_schema=False)]
"""A query parameter read as text by its route and declared in the document by :func:`query_parameter`."""


def query_parameter(name: str, schema: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    """An optional query parameter for a route's ``openapi_extra``: typed as clients should send it, for a
    route that reads the raw text itself (to name the parameter in its own 422)."""
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description, **extra}


REASON_MAX = 500
"""Most characters of a destructive action's ``reason``, as for a bulk action's and a pause's."""

REASON_PARAMETER: dict[str, Any] = {
    "name": "reason",
    "in": "query",
    "required": True,
    "description": "Why (1 to 500 characters): kept in the audit log with the action.",
    "schema": {"type": "string", "minLength": 1, "maxLength": REASON_MAX},
}
"""The OpenAPI parameter of a destructive single action's ``?reason=`` (read by :func:`required_reason`)."""


def required_reason(request: Request, what: str) -> str:
    """The ``reason`` query parameter a destructive action needs, checked.

    :param what: the action, for the message (``delete a task``).
    :returns: the reason as given.
    :raises InvalidTaskError: missing or blank (``reason: required to delete a task: ...``), longer than
        :data:`REASON_MAX` characters, or holding a NUL character (422 naming ``reason``).
    """
    raw = request.query_params.get("reason")
    if raw is None or not raw.strip():
        raise InvalidTaskError("reason", f"required to {what} (?reason=...): kept in the audit log")
    if len(raw) > REASON_MAX:
        raise InvalidTaskError("reason", f"at most {REASON_MAX} characters, not {len(raw)}")
    check_json(raw, "reason")
    return raw


def parse_task_id(raw: str) -> uuid.UUID:
    """A task id from the path.

    :raises InvalidTaskError: not a UUID (422 naming ``task_id``).
    """
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise InvalidTaskError("task_id", "must be a UUID") from None


def check_queue(queue: str) -> None:
    """A queue name from the path.

    :raises InvalidTaskError: it does not match ``[A-Za-z0-9_.:-]{1,128}`` (422 naming ``queue``).
    """
    if not _NAME.fullmatch(queue):
        raise InvalidTaskError("queue", "must match [A-Za-z0-9_.:-]{1,128}")


def is_name(value: str) -> bool:
    """Whether ``value`` could be a task, queue or schedule name."""
    return _NAME.fullmatch(value) is not None


async def task_warnings(state: AppState, created: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """A warning for each created ``(queue, task name)`` that no live instance will run.

    Either no live instance serves the queue (a typo such as ``defualt``
    waits for ever), or none of those serving it has a handler for the name (the
    task would fail when claimed). The create still succeeds and says so. What live instances
    serve is cached (:class:`~taskmesh.api.state.ServedQueues`). When PostgreSQL cannot say,
    there are no warnings (the task is stored already; the answer must not turn into an error).

    :returns: ``{(queue, name): "queue 'defualt' is served by no live instance"}`` or
        ``"no live instance serving queue 'reports' has a handler for 'reprot.export'"``.
    """
    wanted = set(created)
    if not wanted or state.stores is None:
        return {}
    try:
        served = await state.served.get(state.stores.pg)
    except StoreError as exc:
        log.warning("served_queues_unknown", error=str(exc))
        return {}
    warnings: dict[tuple[str, str], str] = {}
    for queue, name in sorted(wanted):
        if queue not in served:
            warnings[queue, name] = f"queue {queue!r} is served by no live instance"
            continue
        names = served[queue]
        if names is not None and name not in names:
            warnings[queue, name] = f"no live instance serving queue {queue!r} has a handler for {name!r}"
    return warnings


def with_trace(spec: TaskSpec, request: Request) -> TaskSpec:
    """The body's ``trace_id`` wins; else the request's ``traceparent``/``X-Request-ID``."""
    if spec.trace_id is not None:
        return spec
    found = trace_id_from_headers(request.headers)
    return spec if found is None else spec.model_copy(update={"trace_id": found})
