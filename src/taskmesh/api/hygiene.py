"""ASGI middleware for what a browser can be made to send: a ``Host`` not allowed, a
request from another site's page, and a body that is not JSON; and pages no other page may frame.

- **Host** (DNS rebinding): a page on ``evil.example`` whose name is made to resolve to
  127.0.0.1 reaches an instance on loopback with ``Host: evil.example``. Only the names of
  ``allowed_hosts`` are answered; an instance on loopback allows its loopback names by
  default, one on another address any name (it sits behind a proxy or a load balancer,
  which names it). Others get 400 problem+json.
- **Another site's page** (cross-site request forgery): a page on any site can make the
  browser POST to the API without asking first (no body, or a form), and on an open instance
  (no key made yet, as after ``make run``) nothing else stops it pausing queues or replaying
  the DLQ. An ``/api/`` request whose ``Sec-Fetch-Site`` is ``cross-site`` or ``same-site``, or
  whose ``Origin`` names another host or port than its ``Host`` (``null`` too), is refused
  with 403 unless it carries a key (``Authorization: Bearer`` or ``X-API-Key``): a page can
  send those only after a CORS preflight that ``cors_allowed_origins`` allows. A CLI or
  curl sends neither header and is let through.
- **Content-Type** (cross-site forms): an HTML form on any page can POST
  ``application/x-www-form-urlencoded``, ``multipart/form-data`` or ``text/plain`` without
  the browser asking first. The API's bodies are JSON, so a body of any other type, or one
  without a type, is refused with 415 before it is read.
- **Framing** (clickjacking): an HTML page outside the console (``/docs``, ``/redoc``) is
  answered with ``Content-Security-Policy: frame-ancestors 'none'`` and ``X-Frame-Options:
  DENY`` (the console sets its own, stricter policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskmesh.api.problems import problem

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""The names an instance on a loopback address answers unless ``allowed_hosts`` says otherwise."""
_WITH_BODY = ("POST", "PUT", "PATCH")
_OTHER_SITE = ("cross-site", "same-site")
_KEY_NEEDED = "a page of another site may not call the API without an API key (Authorization: Bearer, or X-API-Key)"
_NO_FRAMING = [(b"content-security-policy", b"frame-ancestors 'none'"), (b"x-frame-options", b"DENY")]


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


def same_host(origin: str, host: str) -> bool:
    """Whether the ``Origin`` header ``origin`` names the host and port of the ``Host`` header ``host``.

    The scheme is not compared (behind a proxy that ends TLS the page is ``https`` and the
    request the instance sees is ``http``); a port left out is the origin scheme's default.
    ``null`` and anything that is not ``http(s)://host[:port]`` name no host.
    """
    try:
        page, sent_to = urlsplit(origin), urlsplit("//" + host.strip())
        default = {"http": 80, "https": 443}.get(page.scheme)
        if default is None or not page.hostname or not sent_to.hostname:
            return False
        return (page.hostname, page.port or default) == (sent_to.hostname, sent_to.port or default)
    except ValueError:  # a port that is not a number, a bracket left open
        return False


def other_site(headers: dict[bytes, str]) -> Response | None:
    """The 403 of a request that another site's page sent without a key; ``None`` for any other.

    :param headers: the request's headers, names lower-case.
    """
    scheme, _, key = headers.get(b"authorization", "").strip().partition(" ")
    if (scheme.lower() == "bearer" and key.strip()) or headers.get(b"x-api-key", "").strip():
        # A page sends these only after a preflight that cors_allowed_origins allowed. Not Basic:
        # a browser attaches credentials it remembers for the host to any site's request.
        return None
    site = headers.get(b"sec-fetch-site", "").strip().lower()
    if site in _OTHER_SITE:
        return _cross_site(
            "Sec-Fetch-Site", f"{site}: {_KEY_NEEDED}", f"{site}: another site's page, without an API key"
        )
    origin = headers.get(b"origin")
    host = headers.get(b"host", "")
    if origin is not None and not same_host(origin, host):
        return _cross_site(
            "Origin", f"{origin} is not this host ({host}): {_KEY_NEEDED}", "another host's page, without an API key"
        )
    return None


def _cross_site(field: str, detail: str, message: str) -> Response:
    return problem(403, "Cross-site request refused", f"{field}: {detail}", errors=[(field, message)])


class BrowserGuard:
    """Refuses a ``Host`` outside ``allowed_hosts`` (400), an ``/api/`` request from another site's
    page without a key (403) and an ``/api/`` body that is not JSON (415); keeps pages outside the
    console out of other pages' frames.

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
        if path.startswith("/api/"):
            refused = other_site(headers)
            if refused is not None:
                await refused(scope, receive, send)
                return
        elif not path.startswith("/console"):
            send = _unframed(send)
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


def _unframed(send: Send) -> Send:
    """``send`` adding :data:`_NO_FRAMING` to an HTML answer that sets no policy of its own."""

    async def unframed(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers", [])
            names = {name.lower() for name, _ in headers}
            media = next((value for name, value in headers if name.lower() == b"content-type"), b"")
            if media.startswith(b"text/html") and b"content-security-policy" not in names:
                message["headers"] = [*headers, *_NO_FRAMING]
        await send(message)

    return unframed
