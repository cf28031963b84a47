"""The HTTP API (FastAPI): the app, its middleware, its error table and its routers.

A thin layer: routes parse and validate input, call the facades
(:class:`taskmesh.tasks.tasks.Tasks`, :class:`taskmesh.schedules.schedules.Schedules`, the
stores' typed queries) and render answers; no SQL or Redis here. Every error
is RFC 9457 problem+json naming the field (``api/errors.py``). The OpenAPI
document is at ``/openapi.json``, browsable at ``/docs`` and ``/redoc`` with their
assets served from the installed ``fastapi-offline`` package (no CDN: they work offline);
each route names its operation id and tag, its answers are the shared schemas of
``api/schemas/``, and ``api/contract.py`` completes the document (tags, problem and bodies).
Routers: ``routes/tasks.py``, ``routes/queues.py``, ``routes/schedules.py``,
``routes/workers.py``, ``routes/keys.py``, ``routes/audit.py``,
``routes/health.py`` (the last also on a worker-only instance).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline

from taskmesh import __version__, extras
from taskmesh.api import contract, errors
from taskmesh.api.audit_trail import AuditTrail
from taskmesh.api.auth import SCOPE_OF
from taskmesh.api.hygiene import BrowserGuard
from taskmesh.api.limits import BodyLimit
from taskmesh.api.observe import ObserveRequests
from taskmesh.api.routes import audit, health, keys, limits, queues, schedules, tasks, workers, workflows
from taskmesh.api.state import AppState
from taskmesh.console.lazy import serve_console
from taskmesh.observability.logs import get_logger

__all__ = ["AppState", "create_app"]

log = get_logger("taskmesh.api")


def create_app(
    state: AppState,
    *,
    api_enabled: bool = True,
    allowed_hosts: Sequence[str] = ("*",),
    serve_metrics: bool = True,
    cors_allowed_origins: Sequence[str] = (),
    console_enabled: bool = False,
) -> FastAPI:
    """Build the ASGI app over ``state``.

    :param api_enabled: serve the ``/api/v1`` routes; without them (a worker-only
        instance, or the ``metrics_port`` listener) the app still answers ``/healthz`` and ``/readyz``.
    :param allowed_hosts: the names answered in ``Host`` (see :class:`~taskmesh.api.hygiene.BrowserGuard`).
    :param serve_metrics: serve ``/metrics`` (``False`` on the API's port when ``metrics_port`` is set).
    :param cors_allowed_origins: web origins whose pages may read the API's answers (CORS); none:
        no CORS headers at all.
    :param console_enabled: serve the web console under ``/console`` (only with ``api_enabled``: its
        pages read and act through the API; without the ``console`` extra, ``console_unavailable``
        is logged and the API serves on).
    """
    app = FastAPIOffline(
        title="taskmesh",
        version=__version__,
        description="Distributed task platform: durable state in PostgreSQL, dispatch through Redis.",
        openapi_tags=contract.TAGS,
    )
    contract.install(app)
    app.state.taskmesh = state
    app.add_middleware(AuditTrail, state=state)  # innermost: the route's principal and status are known
    app.add_middleware(BodyLimit)
    app.add_middleware(BrowserGuard, allowed_hosts=allowed_hosts)  # before the body is read
    if cors_allowed_origins:  # outside the guard, so an allowed page can read a 400 or 415 too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_allowed_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type", "X-Request-ID", "traceparent"],
            expose_headers=["Location", "Retry-After", "RateLimit", "RateLimit-Policy", "X-Request-ID"],
            max_age=600,
        )
    app.add_middleware(ObserveRequests, metrics=state.metrics)  # outermost: sees 400s, 413s and 415s too
    errors.install(app)
    if api_enabled:
        for router in (
            tasks.router,
            workflows.router,
            queues.router,
            limits.router,
            schedules.router,
            workers.router,
            keys.router,
            audit.router,
        ):
            _name_scopes(router)
            app.include_router(router)
        if console_enabled and extras.installed("console"):
            serve_console(app)
        elif console_enabled:  # the API serves on: the console is the optional part
            log.warning(
                "console_unavailable",
                reason=extras.message("console", "the web console", "or set console_enabled = false"),
            )
    app.include_router(health.router)
    if serve_metrics:
        app.include_router(health.metrics_router)
    return app


def _name_scopes(router: APIRouter) -> None:
    """``x-required-scope`` on each guarded route of the OpenAPI document (from its :func:`require` guard)."""
    for route in router.routes:
        if isinstance(route, APIRoute):
            for dependency in route.dependencies:
                scope = SCOPE_OF.get(dependency.dependency)  # type: ignore[arg-type]
                if scope is not None:
                    route.openapi_extra = {**(route.openapi_extra or {}), "x-required-scope": scope}
