"""The console's routes: its pages, forms and static files (loaded by :mod:`taskmesh.console.lazy`)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from taskmesh.console import actions, bulk_pages, limit_pages, pages, platform_pages, signing, workflow_pages


def console_routes(app: FastAPI) -> list[BaseRoute]:
    """Every console route, built for ``app`` (whose dependency overrides they follow), in order."""
    router = APIRouter(dependency_overrides_provider=app)
    for part in (
        signing.router,
        pages.router,
        workflow_pages.router,
        platform_pages.router,
        limit_pages.router,
        bulk_pages.router,
        actions.router,
    ):
        router.include_router(part)
    static = StaticFiles(packages=[("taskmesh.console", "static")])
    return [*router.routes, Mount("/console/static", static, name="console-static")]
