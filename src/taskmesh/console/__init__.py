"""The web console (issue 13): server-rendered pages under ``/console`` over the operator API.

Pages read, and forms act, through the instance's own API as the signed-in key
(:mod:`taskmesh.console.api_client`), so the console has the API's scopes, tenant rule, rate
limits and audit records, and nothing more. Templates are in ``templates/``, the stylesheet and
the one small script in ``static/`` (no CDN, no build step, no inline script: a strict CSP).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.staticfiles import StaticFiles

from taskmesh.console import actions, bulk_pages, pages, platform_pages, signing
from taskmesh.console.web import ConsoleHeaders, SignInNeeded, to_sign_in


def install(app: FastAPI) -> None:
    """Serve the console on ``app``: its routes, its static files, its headers and its sign-in redirect."""
    for router in (signing.router, pages.router, platform_pages.router, bulk_pages.router, actions.router):
        app.include_router(router)
    app.mount("/console/static", StaticFiles(packages=[("taskmesh.console", "static")]), name="console-static")
    app.add_middleware(ConsoleHeaders)

    async def sign_in_needed(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SignInNeeded)
        return to_sign_in(request, exc.why)

    app.add_exception_handler(SignInNeeded, sign_in_needed)
