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
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import redis.exceptions
from redis.asyncio import ConnectionPool

SCHEMES = ("redis", "rediss", "unix")
"""Schemes of a Redis server's own URL: plain TCP, TLS, a Unix socket."""
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
"""Schemes of a URL naming Sentinels and a master name (``rediss+``: the master speaks TLS)."""
SENTINEL_OPTIONS = frozenset({"sentinel_username", "sentinel_password"})
"""Query options of a Sentinel URL: the Sentinels' own credentials, when they ask for any."""

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
    if parts.scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
        return url
    if parts.scheme not in SCHEMES:
        shown = f"{parts.scheme}://" if "://" in url else "no scheme"
        raise ValueError(f"must be a redis://, rediss://, unix:// or redis+sentinel:// URL, not {shown}")
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


def cluster_url_problem(url: str) -> str | None:
    """Why ``url`` cannot name a Redis Cluster node, or ``None`` when it can.

    A cluster has database 0 alone (it refuses ``SELECT``), is reached over TCP, and Sentinel
    watches one master, not a cluster.
    """
    parts = urlsplit(url)
    if parts.scheme in SENTINEL_SCHEMES:
        return 'a redis+sentinel:// URL names one master, not a cluster: use redis_mode = "standalone"'
    if parts.scheme == "unix":
        return "a Redis Cluster is reached over TCP: redis_url must be redis:// or rediss:// in cluster mode"
    numbers = [*parse_qs(parts.query).get("db", []), unquote(parts.path).strip("/")]
    if any(n not in ("", "0") for n in numbers):
        return "a Redis Cluster has database 0 alone (it refuses SELECT): end redis_url with /0 or no number"
    return None


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names (see :func:`parse_sentinel_url`)."""

    sentinels: list[tuple[str, int]]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read ``redis+sentinel://[user:password@]host:port[,host:port…]/master-name[/db]``.

    The user and password are the master's (and its replicas'); the Sentinels' own, when they
    have any, are the query options ``sentinel_username`` and ``sentinel_password``. A host
    without a port is on Sentinel's port, 26379. ``rediss+sentinel://`` reaches the master with TLS.

    :raises ValueError: no Sentinel address, a port that is not a number, no master name, a
        database number that is not a whole number, or an unknown option; never naming a password.
    """
    parts = urlsplit(url)
    at = parts.netloc.rpartition("@")
    credentials, hosts = (at[0], at[2]) if at[1] else ("", parts.netloc)
    sentinels: list[tuple[str, int]] = []
    for address in filter(None, hosts.split(",")):
        host, colon, port = address.rpartition(":")
        if not colon or address.endswith("]"):  # no port (an IPv6 address is in brackets)
            host, port = address, "26379"
        if not (port.isascii() and port.isdigit()) or not host:
            raise ValueError(f"the Sentinel address {address!r} is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    if not sentinels:
        raise ValueError("name at least one Sentinel: redis+sentinel://host:26379,host:26379/master-name")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path:
        raise ValueError("name the master after the Sentinels: redis+sentinel://host:26379/master-name[/db]")
    if len(path) > 2 or (len(path) == 2 and not (path[1].isascii() and path[1].isdigit())):
        shown = "/".join(path[1:])
        raise ValueError(f"the database number {shown!r} is not a whole number (0 to 15 on a default server)")
    query = parse_qs(parts.query)
    unknown = sorted(set(query) - SENTINEL_OPTIONS)
    if unknown:
        raise ValueError(
            f"the option {unknown[0]!r} is not one a Sentinel URL takes (sentinel_username, sentinel_password)"
        )
    user, _, password = credentials.partition(":")
    return SentinelTarget(
        sentinels=sentinels,
        master=path[0],
        db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(user) or None,
        password=unquote(password) or None,
        tls=parts.scheme == "rediss+sentinel",
        sentinel_username=query.get("sentinel_username", [None])[0],
        sentinel_password=query.get("sentinel_password", [None])[0],
    )


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
    if isinstance(exc, redis.exceptions.RedisClusterException) and "Cluster mode is not enabled" in text:
        return NOT_A_CLUSTER
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
        f'redis_url: the server is a Redis Cluster node ({seen}); with redis_mode = "standalone" taskmesh\'s '
        'client would meet MOVED for the keys other nodes own: set redis_mode = "cluster"'
    )


NOT_A_CLUSTER = (
    'redis_url: redis_mode is "cluster" but the server is not a Redis Cluster node '
    '(cluster_enabled:0): set redis_mode = "standalone", or name a cluster node'
)


def sentinel_refusal(master: str, known: list[str]) -> str:
    """The start-up message when the Sentinels answer but know no master named ``master``."""
    names = ", ".join(known) if known else "none"
    return f"redis_url: the Sentinels know no master named {master!r} (they watch: {names})"


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
