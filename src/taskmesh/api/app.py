"""The HTTP API (FastAPI): task routes of the original platform, health, readiness, metrics.

A thin layer: it parses and validates input, calls :class:`taskmesh.tasks.Tasks`,
and renders answers; no SQL or Redis here. Every error is RFC 9457
problem+json naming the field. The OpenAPI document is at ``/openapi.json``.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from taskmesh import __version__
from taskmesh.api.limits import BodyLimit
from taskmesh.api.observe import ObserveRequests
from taskmesh.api.problems import invalid, problem
from taskmesh.clock import Waker
from taskmesh.errors import InvalidTaskError, TaskNotFoundError
from taskmesh.metrics import Metrics
from taskmesh.schedules import ScheduleNotFoundError, Schedules
from taskmesh.services.outage import STORE_ERRORS
from taskmesh.tasks import TaskFinishedError, Tasks
from taskmesh.tracing import trace_id_from_headers
from taskmesh.validation import NAME_REGEX, StrictInt, TaskSpec, check_json, field_errors, parse_task_spec

_NAME = re.compile(NAME_REGEX)
log = structlog.get_logger("taskmesh.api")
DLQ_COUNT_MAX = 1000


@dataclass
class AppState:
    """What the API reads: the task facade once stores are up, readiness flags."""

    metrics: Metrics
    queues: list[str]
    tasks: Tasks | None = None
    schedules: Schedules | None = None
    schedule_waker: Waker = field(default_factory=Waker)
    draining: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class ReplayRequest(BaseModel):
    """Body of ``POST /api/v1/queues/{queue}/dlq/replay``."""

    model_config = ConfigDict(extra="forbid")

    count: StrictInt = Field(default=1, ge=1, le=DLQ_COUNT_MAX)
    override_priority: StrictInt | None = Field(default=None, ge=0, le=1000)


BATCH_MAX = 1000


class BatchRequest(BaseModel):
    """Body of ``POST /api/v1/tasks:batch``: up to 1,000 tasks; ``atomic`` stores all or none."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[TaskSpec] = Field(min_length=1, max_length=BATCH_MAX)
    atomic: bool = False


class TriggerRequest(BaseModel):
    """Body of ``POST /api/v1/schedules/{name}/trigger`` (optional): the fire's own idempotency key."""

    model_config = ConfigDict(extra="forbid")

    idempotency_key: str | None = Field(default=None, min_length=1, max_length=512)


class Created(BaseModel):
    task_id: uuid.UUID
    status: str
    trace_id: str | None = None
    deduplicated: bool = False


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json", headers=headers)


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


async def _read_json(request: Request, nested_field: str) -> Any:
    """Parse the body; nesting beyond orjson's limit is reported on ``nested_field`` (422)."""
    body = await request.body()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        reason = str(exc).lower()
        if "depth limit" in reason or "recursion" in reason:  # orjson's own nesting limit (1024)
            raise InvalidTaskError(nested_field, "nested deeper than 64 levels") from None
        raise _BadJson(str(exc)) from None


class _BadJson(Exception):
    pass


def create_app(state: AppState, *, api_enabled: bool = True) -> FastAPI:
    """Build the ASGI app over ``state`` (see module docs for the routes).

    :param api_enabled: serve the ``/api/v1`` routes; without them (a worker-only
        instance) the app still answers ``/healthz``, ``/readyz`` and ``/metrics``.
    """
    app = FastAPI(
        title="taskmesh",
        version=__version__,
        description="Distributed task platform: durable state in PostgreSQL, dispatch through Redis.",
    )
    app.add_middleware(BodyLimit)
    app.add_middleware(ObserveRequests, metrics=state.metrics)  # outermost: sees 413s too

    def tasks() -> Tasks:
        if state.tasks is None:
            raise _NotReady()
        return state.tasks

    def with_trace(spec: TaskSpec, request: Request) -> TaskSpec:
        """The body's ``trace_id`` wins; else the request's ``traceparent``/``X-Request-ID``."""
        if spec.trace_id is not None:
            return spec
        found = trace_id_from_headers(request.headers)
        return spec if found is None else spec.model_copy(update={"trace_id": found})

    def parse_id(raw: str) -> uuid.UUID:
        try:
            return uuid.UUID(raw)
        except ValueError:
            raise InvalidTaskError("task_id", "must be a UUID") from None

    def check_queue(queue: str) -> None:
        if not _NAME.fullmatch(queue):
            raise InvalidTaskError("queue", "must match [A-Za-z0-9_.:-]{1,128}")

    @app.exception_handler(InvalidTaskError)
    async def _invalid(_: Request, exc: InvalidTaskError) -> Response:
        return invalid(exc.field, exc.message, getattr(exc, "errors", None))

    @app.exception_handler(_BadJson)
    async def _bad_json(_: Request, exc: _BadJson) -> Response:
        return problem(400, "Malformed JSON", f"body: not valid JSON ({exc})", errors=[("body", "not valid JSON")])

    @app.exception_handler(TaskNotFoundError)
    async def _not_found(_: Request, exc: TaskNotFoundError) -> Response:
        return problem(404, "Task not found", f"no task has id {exc}")

    @app.exception_handler(ScheduleNotFoundError)
    async def _no_schedule(_: Request, exc: ScheduleNotFoundError) -> Response:
        return problem(404, "Schedule not found", f"no schedule is named {exc.name!r}")

    @app.exception_handler(_NotReady)
    async def _not_ready(_: Request, exc: _NotReady) -> Response:
        return problem(503, "Not ready", "the instance is still connecting to PostgreSQL and Redis")

    for error_type in STORE_ERRORS:

        @app.exception_handler(error_type)
        async def _store_down(_: Request, exc: Exception) -> Response:
            return problem(503, "Store unavailable", f"a store did not answer: {type(exc).__name__}")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.error("api_error", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return problem(500, "Internal error", "the server failed to answer; the error is logged")

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        errors = [(".".join(str(p) for p in e["loc"][1:]) or "request", e["msg"]) for e in exc.errors()]
        return invalid(errors[0][0], errors[0][1], errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        return problem(exc.status_code, str(exc.detail), str(exc.detail))

    @app.post(
        "/api/v1/tasks",
        status_code=201,
        response_model=Created,
        openapi_extra=_body_schema(TaskSpec),
        summary="Create a task (200 with the existing task_id when dedup_key repeats)",
    )
    async def create_task(request: Request) -> Response:
        spec = with_trace(parse_task_spec(await _read_json(request, "payload")), request)
        result = await tasks().enqueue(spec)
        body = {"task_id": str(result.task_id), "status": result.status, "trace_id": result.trace_id}
        if not result.created:
            return _json({**body, "deduplicated": True}, 200)
        return _json(body, 201, headers={"Location": f"/api/v1/tasks/{result.task_id}"})

    @app.post(
        "/api/v1/tasks:batch",
        openapi_extra=_body_schema(BatchRequest),
        summary="Create up to 1,000 tasks with one statement; each item's outcome is reported",
    )
    async def create_batch(request: Request) -> Response:
        data = await _read_json(request, "tasks")
        if not isinstance(data, dict):
            raise InvalidTaskError("body", "must be a JSON object")
        unknown = sorted(set(data) - {"tasks", "atomic"})
        if unknown:
            raise InvalidTaskError(unknown[0], "unknown field")
        items = data.get("tasks")
        atomic = data.get("atomic", False)
        if not isinstance(atomic, bool):
            raise InvalidTaskError("atomic", "must be true or false")
        if not isinstance(items, list) or not 1 <= len(items) <= BATCH_MAX:
            raise InvalidTaskError("tasks", f"must be a list of 1 to {BATCH_MAX} tasks")
        specs: list[TaskSpec] = []
        positions: list[int] = []
        results: list[dict[str, Any]] = [{} for _ in items]
        for i, item in enumerate(items):
            try:
                specs.append(parse_task_spec(item))
                positions.append(i)
            except InvalidTaskError as exc:
                errors = getattr(exc, "errors", None) or [(exc.field, exc.message)]
                results[i] = {
                    "index": i,
                    "status": "rejected",
                    "errors": [{"field": f"tasks[{i}].{f}", "message": m} for f, m in errors],
                }
        rejected = len(items) - len(specs)
        if atomic and rejected:
            first = next(r for r in results if r)
            return problem(
                422,
                "Invalid request",
                f"{first['errors'][0]['field']}: {first['errors'][0]['message']} (atomic batch: nothing stored)",
                errors=[(e["field"], e["message"]) for r in results if r for e in r["errors"]],
                results=[r or {"index": i, "status": "not stored"} for i, r in enumerate(results)],
            )
        outcomes = await tasks().enqueue_many([with_trace(s, request) for s in specs])
        for i, outcome in zip(positions, outcomes, strict=True):
            results[i] = {
                "index": i,
                "status": "created" if outcome.created else "deduplicated",
                "task_id": str(outcome.task_id),
                "trace_id": outcome.trace_id,
            }
        created = sum(1 for o in outcomes if o.created)
        return _json(
            {
                "created": created,
                "deduplicated": len(outcomes) - created,
                "rejected": rejected,
                "results": results,
            }
        )

    @app.get("/api/v1/tasks/{task_id}", summary="A task and its latest run")
    async def get_task(task_id: str) -> Response:
        task, run = await tasks().get(parse_id(task_id))
        return _json({"task": task, "latest_run": run})

    @app.get("/api/v1/tasks/{task_id}/runs", summary="Every run (attempt) of a task")
    async def get_runs(task_id: str) -> Response:
        tid = parse_id(task_id)
        return _json({"task_id": str(tid), "runs": await tasks().runs(tid)})

    @app.post(
        "/api/v1/tasks/{task_id}/cancel",
        summary="Cancel a task: a queued one never runs (200), a running one is cancelled on its worker (202)",
    )
    async def cancel_task(task_id: str) -> Response:
        tid = parse_id(task_id)
        try:
            done = await tasks().cancel(tid)
        except TaskFinishedError as exc:
            return problem(409, "Task already finished", f"task {tid} is {exc.status}; there is nothing to cancel")
        if done.status == "cancelled":
            return _json({"task_id": str(tid), "status": "cancelled"})
        return _json({"task_id": str(tid), "status": "running", "cancel_requested": True}, 202)

    @app.get("/api/v1/workers", summary="Registered instances, live first, with their in-flight runs")
    async def list_workers() -> Response:
        return _json({"workers": await tasks().workers()})

    @app.get("/api/v1/queues/{queue}/dlq", summary="Dead-lettered tasks of a queue, oldest first")
    async def get_dlq(queue: str, count: str = "50") -> Response:
        check_queue(queue)
        if not (count.isascii() and count.isdigit()) or not 1 <= int(count) <= DLQ_COUNT_MAX:
            raise InvalidTaskError("count", f"must be an integer between 1 and {DLQ_COUNT_MAX}")
        items = await tasks().dead_letters(queue, int(count))
        return _json({"queue": queue, "count": len(items), "tasks": items})

    @app.post(
        "/api/v1/queues/{queue}/dlq/replay",
        openapi_extra=_body_schema(ReplayRequest),
        summary="Replay dead-lettered tasks, oldest first; priority changes only with override_priority",
    )
    async def replay(queue: str, request: Request) -> Response:
        check_queue(queue)
        data = await _read_json(request, "body")
        if not isinstance(data, dict):
            raise InvalidTaskError("body", "must be a JSON object")
        try:
            req = ReplayRequest.model_validate(data)
        except ValidationError as exc:
            errors = field_errors(exc)
            return invalid(errors[0][0], errors[0][1], errors)
        ids = await tasks().replay(queue, req.count, req.override_priority)
        return _json({"queue": queue, "count": len(ids), "replayed": ids})

    def schedules(name: str | None = None) -> Schedules:
        if name is not None and not _NAME.fullmatch(name):
            raise ScheduleNotFoundError(name)  # no schedule can have this name (NUL, spaces, too long)
        if state.schedules is None:
            raise _NotReady()
        return state.schedules

    @app.get("/api/v1/schedules", summary="Cron schedules: spec, zone, state, last fire and the next five fires")
    async def list_schedules() -> Response:
        return _json({"schedules": await schedules().list()})

    @app.get("/api/v1/schedules/{name}", summary="One cron schedule")
    async def get_schedule(name: str) -> Response:
        return _json(await schedules(name).get(name))

    @app.post(
        "/api/v1/schedules/{name}/trigger",
        status_code=201,
        openapi_extra={
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": TriggerRequest.model_json_schema()}},
            }
        },
        summary="Fire a schedule now (201; 200 when the given idempotency_key already made a task)",
    )
    async def trigger_schedule(name: str, request: Request) -> Response:
        body = await request.body()
        data: Any = {} if not body.strip() else await _read_json(request, "body")
        if not isinstance(data, dict):
            raise InvalidTaskError("body", "must be a JSON object")
        if isinstance(data.get("idempotency_key"), str):
            check_json(data["idempotency_key"], "idempotency_key")
        try:
            req = TriggerRequest.model_validate(data)
        except ValidationError as exc:
            errors = field_errors(exc)
            return invalid(errors[0][0], errors[0][1], errors)
        task_id, key, created = await schedules(name).trigger(name, req.idempotency_key)
        state.schedule_waker.wake()
        answer = {"schedule": name, "task_id": str(task_id), "idempotency_key": key, "created": created}
        if not created:
            return _json(answer, 200)
        return _json(answer, 201, headers={"Location": f"/api/v1/tasks/{task_id}"})

    @app.post("/api/v1/schedules/{name}/pause", summary="Pause a schedule until resumed or its config changes")
    async def pause_schedule(name: str) -> Response:
        answer = await schedules(name).set_paused(name, True)
        state.schedule_waker.wake()
        return _json(answer)

    @app.post("/api/v1/schedules/{name}/resume", summary="Resume a schedule; fires missed while paused are not made")
    async def resume_schedule(name: str) -> Response:
        answer = await schedules(name).set_paused(name, False)
        state.schedule_waker.wake()
        return _json(answer)

    @app.get("/healthz", summary="Liveness: the process serves HTTP")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz", summary="Readiness: 200 only when PostgreSQL and Redis answer")
    async def readyz() -> Response:
        checks = {"postgres": "down", "redis": "down"}
        t = state.tasks
        if t is not None:

            async def pg() -> None:
                try:
                    with anyio.fail_after(1):
                        await t.pool.fetchval("SELECT 1")
                    checks["postgres"] = "ok"
                except STORE_ERRORS:
                    pass

            async def rd() -> None:
                try:
                    with anyio.fail_after(1):
                        await t.redis.ping()
                    checks["redis"] = "ok"
                except STORE_ERRORS:
                    pass

            async with anyio.create_task_group() as tg:
                tg.start_soon(pg)
                tg.start_soon(rd)
        ready = not state.draining and all(v == "ok" for v in checks.values())
        body: dict[str, Any] = {"ready": ready, **checks}
        if state.draining:
            body["draining"] = True
        return _json(body, 200 if ready else 503)

    @app.get("/metrics", summary="Prometheus metrics (gauges of stores sampled by the sampler, not per scrape)")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    if not api_enabled:
        app.router.routes = [r for r in app.router.routes if not getattr(r, "path", "").startswith("/api/")]
        app.openapi_schema = None
    return app


class _NotReady(Exception):
    pass
