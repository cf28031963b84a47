"""The console's pages, loaded on the first request under ``/console`` rather than at start.

The pages (their routes, Jinja2, the API client) are about a quarter of a second of imports,
a third of an instance's start, for a console most instances never serve. :func:`serve_console`
puts one :class:`LazyConsole` route on the API's app; the first request it matches loads
:func:`taskmesh.console.routes.console_routes` in a worker thread (the event loop goes on
running handlers meanwhile) and then every request goes to the loaded routes, exactly as if
they had been there from the start.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI
from starlette.datastructures import URL
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

from taskmesh.console.guard import ConsoleHeaders, SignInNeeded, sign_in_needed

PREFIX = "/console"


def serve_console(app: FastAPI) -> None:
    """Serve the console on ``app``: its headers and sign-in redirect now, its pages at the first request."""
    app.add_middleware(ConsoleHeaders)
    app.add_exception_handler(SignInNeeded, sign_in_needed)
    app.router.routes.append(LazyConsole(app))


class LazyConsole(BaseRoute):
    """One route standing for every console route until they are loaded (see module docs).

    :param app: the API's app: the loaded routes take their dependency overrides from it.
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.routes: list[BaseRoute] | None = None
        self._loading = anyio.Lock()

    def _load(self) -> list[BaseRoute]:
        from taskmesh.console.routes import console_routes

        routes = console_routes(self.app)
        self.routes = routes
        return routes

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """The loaded route's match (its child scope names it as ``route``); before loading, every
        path under ``/console`` matches in full, and :meth:`handle` loads the routes."""
        if scope["type"] != "http" or not _under_console(scope["path"]):
            return Match.NONE, {}
        if self.routes is None:
            return Match.FULL, {}
        partial: tuple[Match, Scope] | None = None
        for route in self.routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                return match, {**child, "route": route}
            if match is Match.PARTIAL and partial is None:
                partial = match, {**child, "route": route}
        return partial or (Match.NONE, {})

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Hand the request to the loaded route that matched it (loading the routes first, once).

        A path no console route serves is answered as the router answers it later: a redirect
        to the same path with its trailing slash toggled when a route serves that one.

        :raises HTTPException: 404, a path under ``/console`` that no console route serves
            (on the first request only; later ones never match it here).
        """
        route = scope.get("route")
        if route is None or route is self:  # matched before the routes were loaded
            async with self._loading:
                if self.routes is None:
                    await anyio.to_thread.run_sync(self._load)
            match, child = self.matches(scope)
            if match is Match.NONE:
                # What the router does for any later request that no route matches: the same path
                # with its trailing slash toggled, when a console route serves that one.
                other = _slash_toggled(scope)
                if self.matches(other)[0] is not Match.NONE:
                    await RedirectResponse(url=str(URL(scope=other)))(scope, receive, send)
                    return
                raise HTTPException(status_code=404)
            scope.update(child)
            route = child["route"]
        await route.handle(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        """The path of the console route ``name`` (loads the routes if they are not yet).

        :raises NoMatchFound: no console route has that name.
        """
        for route in self.routes if self.routes is not None else self._load():
            try:
                return route.url_path_for(name, **path_params)
            except NoMatchFound:
                continue
        raise NoMatchFound(name, path_params)


def _slash_toggled(scope: Scope) -> Scope:
    path = str(scope["path"])
    return {**scope, "path": path[:-1] if path.endswith("/") else path + "/"}


def _under_console(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")
