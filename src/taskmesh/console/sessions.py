"""Console sessions: a cookie made from an API key at sign-in, stored hashed in PostgreSQL.

The cookie (:data:`COOKIE`) holds a random secret; ``console_sessions`` holds SHA-256 of it, the
key it was made with (``None`` for a visitor of an open instance), a CSRF token and an expiry.
A request carrying the cookie acts as that key (:func:`taskmesh.api.auth.authenticate`), so the
key's scopes, tenant, queues, rate limits and revocation hold for the console as for the API.
A change (any method but GET and HEAD) must also carry the session's CSRF token in
``X-CSRF-Token`` and must not come from another site (``Sec-Fetch-Site``, ``Origin``):
:func:`check_change`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from starlette.requests import HTTPConnection

from taskmesh.errors import ForgedRequestError
from taskmesh.store import PgStore

COOKIE = "tm_console"
"""The session cookie's name (HttpOnly, SameSite=Strict, path ``/``, Secure over HTTPS)."""

CSRF_HEADER = "x-csrf-token"
"""Where a change carries the session's CSRF token (the console's forms send it as a field)."""

_SAFE = ("GET", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class Session:
    """A signed-in (or open-instance) console session.

    :ivar key_id: the API key it acts as; ``None`` when made while the instance ran open.
    :ivar csrf_token: what its changes must carry.
    :ivar expires_at: when it ends (the database's clock).
    """

    key_id: str | None
    csrf_token: str
    expires_at: datetime


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


async def start(pg: PgStore, key_id: str | None, ttl_seconds: float) -> tuple[str, Session]:
    """Make a session for ``key_id``.

    :returns: the cookie's secret (shown to nobody but the browser) and the session.
    :raises StoreError: PostgreSQL failed.
    """
    secret = secrets.token_urlsafe(32)
    csrf = secrets.token_urlsafe(24)
    expires = await pg.sessions.insert(_hash(secret), key_id, csrf, ttl_seconds)
    return secret, Session(key_id, csrf, expires)


async def find(pg: PgStore, secret: str | None) -> Session | None:
    """The unexpired session of a cookie's ``secret`` (``None``: no cookie, unknown, or expired).

    :raises StoreError: PostgreSQL failed.
    """
    if not secret or len(secret) > 128:
        return None
    row = await pg.sessions.lookup(_hash(secret))
    if row is None:
        return None
    return Session(row["key_id"], row["csrf_token"], row["expires_at"])


async def end(pg: PgStore, secret: str | None) -> None:
    """Sign-out: the session of ``secret`` is deleted (nothing happens for an unknown one).

    :raises StoreError: PostgreSQL failed.
    """
    if secret and len(secret) <= 128:
        await pg.sessions.delete(_hash(secret))


def check_origin(conn: HTTPConnection) -> None:
    """Refuse a request whose ``Origin`` names another host or port than the one it was sent to.

    The scheme is not compared: behind a proxy that ends TLS the page is ``https`` and the request
    the instance sees is ``http``.

    :raises ForgedRequestError: the origin differs (403 naming ``Origin``).
    """
    origin = conn.headers.get("origin")
    if origin is None or origin == "null":
        return
    origin_host = origin.split("://", 1)[-1].rstrip("/").lower()
    host = conn.headers.get("host", "").strip().lower()
    for default in (":80", ":443"):  # a default port is left out of one and may be written in the other
        origin_host, host = origin_host.removesuffix(default), host.removesuffix(default)
    if origin_host != host:
        raise ForgedRequestError("Origin", f"a change from {origin} is refused: it is not this console's origin")


def check_change(conn: HTTPConnection, session: Session, token: str | None) -> None:
    """Refuse a change that the console's own page did not send.

    :param token: the CSRF token the request carried (header or form field).
    :raises ForgedRequestError: another site sent it (``Sec-Fetch-Site`` is ``cross-site`` or
        ``same-site``, or ``Origin`` names another host), or ``token`` is not the session's.
    """
    if conn.scope.get("method", "GET") in _SAFE:
        return
    site = conn.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise ForgedRequestError("Sec-Fetch-Site", f"a change from another site ({site}) is refused")
    check_origin(conn)
    if not token or not hmac.compare_digest(token.encode(), session.csrf_token.encode()):
        raise ForgedRequestError(
            "X-CSRF-Token", "a change with the console's session needs the session's CSRF token; reload the page"
        )
