"""Health routes: liveness, readiness (``router``) and metrics (``metrics_router``), served also when
the API is off; the metrics also on a port of their own (``metrics_port``)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse, Response

from taskmesh import __version__
from taskmesh.api.auth import authenticate, platform_wide
from taskmesh.api.deps import StateDep, json_response
from taskmesh.api.problems import only_problems
from taskmesh.api.schemas import Liveness, Readiness
from taskmesh.errors import StoreError

router = APIRouter()
metrics_router = APIRouter()

PING_TIMEOUT_SECONDS = 1.0


@router.get(
    "/healthz",
    operation_id="getLiveness",
    tags=["health"],
    response_model=Liveness,
    responses=only_problems(500),
    summary="Liveness: the process serves HTTP",
)
async def healthz() -> Response:
    """200 while the process serves, naming the release it runs (``version``)."""
    return json_response({"status": "ok", "version": __version__})


@router.get(
    "/readyz",
    operation_id="getReadiness",
    tags=["health"],
    response_model=Readiness,
    summary="Readiness: 200 only when PostgreSQL and Redis answer, no critical service is down and the schema fits",
    responses={
        503: {"description": "Not ready: the same body with `ready: false`, naming what is down", "model": Readiness},
        **only_problems(500),
    },
)
async def readyz(state: StateDep) -> Response:
    """200 when both stores answer within a second, the instance is not draining, no critical
    service is restarting or failed and PostgreSQL refused no statement against its schema within
    ``schema_error_window_seconds`` (named in ``schema_mismatch``); 503 otherwise. Services not
    running are named in ``services``.

    Each store reads ``ok``, ``down`` (no answer), ``error`` (an answer taskmesh cannot work with,
    such as ``MOVED``; the message is in ``errors``) or, before the instance has connected,
    ``connecting`` while it has not yet been tried or answered."""
    # Until the stores answered, each one's start-up state: only the one that failed reads "down".
    checks = {"postgres": "down", "redis": "down"} if state.stores is not None else dict(state.startup)
    stores = state.stores
    errors: dict[str, str] = {}
    if stores is not None:

        async def check(name: str, ping: Any) -> None:
            try:
                await ping()
                checks[name] = "ok"
            except StoreError as exc:
                if not exc.transient:  # answers, but not as taskmesh needs (MOVED, a refused command)
                    checks[name] = "error"
                    errors[name] = str(exc)
            except TimeoutError:
                pass

        async def redis_ping() -> None:
            with anyio.fail_after(PING_TIMEOUT_SECONDS):  # redis-py drops a connection it was cancelled on
                await stores.redis.probe(state.queues)

        async with anyio.create_task_group() as tg:
            # PostgreSQL's ping has asyncpg's own timeout: cancelling a query from outside can leave
            # its pooled connection in a state the next caller trips over.
            tg.start_soon(check, "postgres", lambda: stores.pg.ping(timeout=PING_TIMEOUT_SECONDS))
            tg.start_soon(check, "redis", redis_ping)
    down = state.services.down()
    mismatch = state.schema.recent()
    ready = (
        stores is not None
        and not state.draining
        and all(v == "ok" for v in checks.values())
        and not state.services.critical_down()
        and mismatch is None
    )
    body: dict[str, Any] = {"ready": ready, **checks}
    if errors:
        body["errors"] = errors
    if down:
        body["services"] = down
    if state.draining:
        body["draining"] = True
    if mismatch is not None:
        ago = round(max(0.0, state.schema.clock() - mismatch.at), 3)
        body["schema_mismatch"] = {"operation": mismatch.operation, "sqlstate": mismatch.sqlstate, "seconds_ago": ago}
    return json_response(body, 200 if ready else 503)


@router.head("/healthz", include_in_schema=False)
async def healthz_head() -> Response:
    """``GET /healthz``'s status without its body (load balancers probe with HEAD)."""
    return Response(status_code=(await healthz()).status_code)


@router.head("/readyz", include_in_schema=False)
async def readyz_head(state: StateDep) -> Response:
    """``GET /readyz``'s status without its body."""
    return Response(status_code=(await readyz(state)).status_code)


@metrics_router.get(
    "/metrics",
    operation_id="getMetrics",
    tags=["health"],
    summary="Prometheus metrics (gauges of stores sampled by the sampler, not per scrape)",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "The exposition text"},
        **only_problems(401, 403, 500, 503),
    },
)
async def metrics(request: Request, state: StateDep) -> Response:
    """The exposition text; with ``metrics_auth = "scope"``, only for a key with ``metrics:read``."""
    if state.metrics_protected:
        await authenticate(request, state, "metrics:read")
        platform_wide(request, "metrics:read", "the metrics", every_queue=True)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
