"""Redis URLs, read before anything connects, and the refusals that end start-up.

redis-py reads a URL leniently: a database number that is not a number (``redis://h:6379/abc``)
is silently database 0, which may be another deployment's data. :func:`check_redis_url` refuses
what redis-py would misread, so ``redis_url`` is a config error naming the part at fault.

Some answers mean that the same connection will never work until someone changes the URL or
the server (a refused password, a failed TLS handshake, a database number the server refuses, a
Redis Cluster node behind a standalone client): :func:`refusal` words them, naming
``redis_url``, so that start-up ends with that message instead of waiting for ever. Messages
never repeat the URL, which may hold a password.
"""

from __future__ import annotations

import re
import ssl
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import redis.exceptions
from redis.asyncio import ConnectionPool

SCHEMES = ("redis", "rediss", "unix")
"""Schemes taskmesh accepts: plain TCP, TLS, a Unix socket."""

TLS_FAILED = "redis_url: the TLS handshake with Redis failed"
PLAIN_ON_TLS = (
    "redis_url: the URL asks for TLS (rediss://) but the server on that port speaks plain Redis: "
    "use redis:// or the server's TLS port"
)
_AUTH_WORDS = ("NOAUTH", "WRONGPASS", "invalid password", "invalid username-password pair", "Authentication")
_CLUSTER_WORDS = ("MOVED ", "ASK ", "CLUSTERDOWN", "SELECT is not allowed in cluster mode")


def check_redis_url(url: str) -> str:
    """Return ``url`` unchanged when redis-py reads it as written.

    :param url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) or
        ``unix:///path?db=N``; query options are redis-py's (``ssl_cert_reqs``, ``ssl_ca_certs``…).
    :returns: the same URL.
    :raises ValueError: an unknown scheme, a database number that is not a whole number, a port
        that is not a number, an option redis-py does not know or a value it refuses; the message
        names the part, never the password.
    """
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        shown = f"{parts.scheme}://" if "://" in url else "no scheme"
        raise ValueError(f"must be a redis://, rediss:// or unix:// URL, not {shown}")
    numbers = list(parse_qs(parts.query).get("db", []))
    path = unquote(parts.path)
    if parts.scheme != "unix" and path.strip("/"):
        numbers.append(path.strip("/"))
    for number in numbers:
        if not (number.isascii() and number.isdigit()):
            raise ValueError(f"the database number {number!r} is not a whole number (0 to 15 on a default server)")
    try:
        # Building a connection object opens nothing, and is where an unknown option is met.
        ConnectionPool.from_url(url).make_connection()  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ValueError(f"redis-py cannot read it: {exc}") from None
    except TypeError as exc:
        unknown = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
        name = unknown.group(1) if unknown else str(exc)
        raise ValueError(
            f"the option {name!r} is not one redis-py knows (such as ssl_ca_certs, ssl_cert_reqs, socket_timeout)"
        ) from None
    return url


def refusal(exc: BaseException) -> str | None:
    """The start-up message for an answer that retrying cannot fix, or ``None`` for an outage.

    :param exc: what redis-py raised for a ``PING`` or ``INFO`` on a new connection.
    :returns: a message naming ``redis_url``; ``None`` when the server may simply not be up yet.
    """
    text = _first_line(exc)
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.AuthenticationWrongNumberOfArgsError):
        return f"redis_url: Redis refused the user or password ({text}); set the ones the server expects"
    if any(word in text for word in _AUTH_WORDS) and isinstance(exc, redis.exceptions.ResponseError):
        return f"redis_url: Redis refused the user or password ({text}); set the ones the server expects"
    if _tls_failed(exc):
        return (
            f"{TLS_FAILED} ({text}); check that the server speaks TLS on "
            "that port (rediss://) and that its certificate is trusted (ssl_ca_certs, ssl_cert_reqs)"
        )
    moved = isinstance(exc, redis.exceptions.MovedError | redis.exceptions.AskError)
    if moved or (isinstance(exc, redis.exceptions.ResponseError) and any(word in text for word in _CLUSTER_WORDS)):
        return cluster_refusal(text)
    if isinstance(exc, redis.exceptions.ResponseError) and "DB index is out of range" in text:
        return f"redis_url: Redis refused the database number ({text}); pick one below its `databases` setting"
    return None


async def speaks_plain_redis(host: str, port: int, timeout: float = 1.0) -> bool:  # noqa: ASYNC109
    """Whether ``host:port`` answers a plain-text ``PING`` as Redis does (``+PONG`` or an error reply).

    Asked only after a TLS connection to it failed: a plain-text server never answers the
    handshake (a timeout), or answers the bytes of it as a command (a TLS error).
    """
    with anyio.move_on_after(timeout):
        try:
            async with await anyio.connect_tcp(host, port) as stream:
                await stream.send(b"PING\r\n")
                reply = await stream.receive(64)
                return reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR", b"-WRONGPASS"))
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError):
            return False
    return False


def cluster_refusal(seen: str) -> str:
    """The start-up message for a standalone client pointed at a Redis Cluster node."""
    return (
        f"redis_url: the server is a Redis Cluster node ({seen}); taskmesh's client is a standalone one here "
        "and would meet MOVED for the keys other nodes own"
    )


def _tls_failed(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):  # redis-py wraps the ssl error once or twice
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError) or "SSL" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]
