"""ASGI middleware for what a browser can be made to send (issue 12): a ``Host`` not allowed, and a
body that is not JSON.

- **Host** (DNS rebinding): a page on ``evil.example`` whose name is made to resolve to
  127.0.0.1 reaches an instance on loopback with ``Host: evil.example``. Only the names of
  ``allowed_hosts`` are answered; an instance on loopback allows its loopback names by
  default, one on another address any name (it sits behind a proxy or a load balancer,
  which names it). Others get 400 problem+json.
- **Content-Type** (cross-site forms): an HTML form on any page can POST
  ``application/x-www-form-urlencoded``, ``multipart/form-data`` or ``text/plain`` without
  the browser asking first. The API's bodies are JSON, so a body of any other type, or one
  without a type, is refused with 415 before it is read.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from taskmesh.api.problems import problem

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""The names an instance on a loopback address answers unless ``allowed_hosts`` says otherwise."""
_WITH_BODY = ("POST", "PUT", "PATCH")


def host_name(value: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8080`` is ``::1``), lower-case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def host_allowed(name: str, allowed: Sequence[str]) -> bool:
    """Whether ``name`` is one of ``allowed``: exact names, ``*`` (any), or ``*.example.com`` (its subdomains)."""
    for pattern in allowed:
        if pattern == "*" or pattern == name or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return True
    return False


class BrowserGuard:
    """Refuses a ``Host`` outside ``allowed_hosts`` (400) and an ``/api/`` body that is not JSON (415).

    :param allowed_hosts: as :func:`host_allowed`; ``/healthz`` and ``/readyz`` are answered
        whatever the ``Host`` (probes name an instance by its address).
    """

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str] = ("*",)) -> None:
        self.app = app
        self.allowed = [h.lower() for h in allowed_hosts]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name: value.decode("latin-1") for name, value in scope["headers"]}
        path: str = scope["path"]
        if path not in ("/healthz", "/readyz"):
            name = host_name(headers.get(b"host", ""))
            if not host_allowed(name, self.allowed):
                response = problem(
                    400,
                    "Host not allowed",
                    f"Host {name!r} is not one of allowed_hosts ({', '.join(self.allowed)})",
                    errors=[("Host", "not one of allowed_hosts")],
                )
                await response(scope, receive, send)
                return
        if scope["method"] in _WITH_BODY and path.startswith("/api/"):
            media = headers.get(b"content-type", "").split(";", 1)[0].strip().lower()
            has_body = headers.get(b"content-length", "0") not in ("", "0") or b"transfer-encoding" in headers
            if (media or has_body) and media != "application/json":
                response = problem(
                    415,
                    "Unsupported media type",
                    f"Content-Type: send the body as application/json, not {media or 'without a type'}",
                    errors=[("Content-Type", "must be application/json")],
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
