"""What the API's app holds of the console from its start: the security headers and the sign-in redirect.

The pages themselves load on the first request under ``/console`` (:mod:`taskmesh.console.lazy`);
these two must be in place before the app serves anything (Starlette fixes its middleware and
exception handlers at the first request).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskmesh.console.redirects import to_sign_in

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The console's Content-Security-Policy: no inline script or style, nothing from another origin."""

_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class ConsoleHeaders:
    """Adds :data:`CSP` and the other security headers to every answer under ``/console``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/console"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class SignInNeeded(Exception):
    """The request has no working session: the page answers with a redirect to the sign-in page."""

    def __init__(self, why: str | None = None) -> None:
        super().__init__(why or "")
        self.why = why


async def sign_in_needed(request: Request, exc: Exception) -> Response:
    """The exception handler of :class:`SignInNeeded`: a redirect to the sign-in page."""
    assert isinstance(exc, SignInNeeded)
    return to_sign_in(request, exc.why)
