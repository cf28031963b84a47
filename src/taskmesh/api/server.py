"""Serving the HTTP API: uvicorn over httptools, with bounds on what one client can take.

:func:`bind_http` binds the listening socket before anything else starts;
:func:`make_server` builds the :class:`Server` (uvicorn without its own signal
handling: the supervisor owns signals) whose protocol enforces
:class:`HttpLimits`:

- ``max_header_bytes`` (default 65,536; setting ``http_max_header_bytes``):
  request line plus headers of one request, through the blank line ending them.
  One byte more is answered ``431`` problem+json and the connection closes;
  bytes past the limit are never handed to the parser, so a client sending
  headers without end costs about the limit in memory, not what it sends
  (10 MiB of one header: +0.4 MiB peak RSS, against +30 MiB on plain uvicorn;
  ``pytest tests/http_limits -s -k ten_mib``). More than ``max_header_fields``
  (default 100) header fields are refused the same way, as each parsed field
  costs over 100 bytes of Python objects whatever its size on the wire.
- ``read_timeout_seconds`` (default 30; ``http_read_timeout_seconds``): from a
  request's first byte, its headers and body must have arrived within this
  time. Past it the answer is ``408`` problem+json when nothing was answered
  yet, the connection closes, and an app waiting on the body (the body-limit
  middleware) gets ``http.disconnect`` and lets go of what it buffered. Idle
  time between requests stays uvicorn's ``timeout_keep_alive`` (5 s), and so
  does the wait for a new connection's first byte.
- ``max_connections`` (default 1,000; ``http_max_connections``): open
  connections of the instance; one more is accepted and closed at once, so the
  listen backlog does not fill. :func:`make_server` raises the process's soft
  ``RLIMIT_NOFILE`` to its hard limit, so that a flood meets this cap and not
  the file-descriptor limit.
- ``max_connections_per_address`` (default 100;
  ``http_max_connections_per_address``): open connections of one client address
  (an IPv6 one by its /64), so that one host cannot take the instance's cap from
  the others; one more is closed at once too (:mod:`taskmesh.api.connections`).

A refused or cut connection is answered (when it can be), half-closed, read and
discarded until the client closes or is quiet for 2 s, then closed
(:mod:`taskmesh.api.linger`), so that the answer is not lost to a reset. So is
a connection whose answer came before its request's body arrived and that is
not kept alive (a 413 to a client that sent ``Connection: close``, as urllib
does): uvicorn would close it with the body unread.

Edges: a request pipelined behind one still being answered is refused by
closing the connection, cutting that answer (nothing else can be written in
order). The read clock keeps running while uvicorn pauses reading because the
app has not taken 64 KiB of body yet; the body-limit middleware takes bodies at
once, so only an app that leaves its body unread that long is cut.

Log events (warning; each at most once per reason every 10 s, ``count`` being
the refusals the line stands for, the other keys those of the last one):
``http_headers_too_large`` (peer, bytes_received, fields, limit),
``http_read_timeout`` (peer, bytes_received, timeout_s, answered),
``http_connections_capped`` (open, limit), ``http_address_connections_capped``
(address, open, limit). At debug: ``fd_limit`` (soft_before, soft, hard); at
warning ``fd_limit_low`` when the open-files limit stays below the connection
cap plus room for the rest of the instance.

Metrics: ``taskmesh_http_refused_total{reason}``, reason one of
``headers_too_large``, ``read_timeout``, ``too_many_connections``,
``too_many_connections_from_address``.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import httptools
import orjson
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_remote_addr

from taskmesh.api.connections import ConnectionGuard, address_key
from taskmesh.api.linger import CycleTransport, Linger
from taskmesh.api.problems import PROBLEM_TYPE
from taskmesh.errors import ConfigError
from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import Metrics

if TYPE_CHECKING:
    from taskmesh.config import Settings

__all__ = [
    "BoundedHttpProtocol",
    "HttpLimits",
    "Server",
    "bind_http",
    "make_server",
    "raise_open_files_limit",
]

log = get_logger("taskmesh.http")

FD_HEADROOM = 100
"""File descriptors kept for the rest of the instance (store pools, listening socket, logs) when
checking the open-files limit against ``max_connections``. An idle instance with the default
pool held 22 (``ls /proc/$PID/fd | wc -l``); ``pg_pool_size`` may add up to 190 more."""


@dataclass(frozen=True)
class HttpLimits:
    """What one instance's HTTP server grants its clients (see module docs).

    :param max_header_bytes: request line plus headers of one request, bytes.
    :param read_timeout_seconds: time for a request's headers and body to arrive, from its first byte.
    :param max_connections: open connections; more are closed when accepted.
    :param max_header_fields: header fields of one request (100, as Apache's ``LimitRequestFields``).
        A parsed field costs over 100 bytes of Python objects: without this bound, 50
        connections sending 64 KiB of ``ab:c`` lines took 66 MiB, with it under 1 MiB
        (``pytest tests/http_limits -s -k tiny_fields``, first run on asyncio).
    :param max_connections_per_address: open connections of one client address (an IPv6 one by
        its /64); more are closed when accepted.
    :raises ValueError: a limit is not positive.
    """

    max_header_bytes: int = 65536
    read_timeout_seconds: float = 30.0
    max_connections: int = 1000
    max_header_fields: int = 100
    max_connections_per_address: int = 100

    def __post_init__(self) -> None:
        for name in (
            "max_header_bytes",
            "read_timeout_seconds",
            "max_connections",
            "max_header_fields",
            "max_connections_per_address",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        """The limits the settings ``http_max_header_bytes``, ``http_read_timeout_seconds``,
        ``http_max_connections`` and ``http_max_connections_per_address`` name."""
        return cls(
            max_header_bytes=settings.http_max_header_bytes,
            read_timeout_seconds=settings.http_read_timeout_seconds,
            max_connections=settings.http_max_connections,
            max_connections_per_address=settings.http_max_connections_per_address,
        )


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a refused request (httptools wraps it)."""


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size limit, a read timeout, connection caps and
    closes that do not lose their answer.

    uvicorn instantiates it per connection; :func:`make_server` subclasses it per
    server with ``guard`` bound. Byte accounting: while a request's head is
    incomplete, data is fed to the parser in slices no longer than what the limit
    has left, so the parser (which buffers a header field until it ends) never holds
    more than the limit. A request beginning inside a chunk whose start was a
    previous request's body is metered by its parser callbacks instead.
    """

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address: str | None = None  # what the connection counts against (connections.address_key)
        self._admitted = False
        self._closing = False
        self._in_body = False  # the current request's headers are complete, its body is not
        self._head_fed = 0  # bytes of the current head fed to the parser (from a known start)
        self._head_seen = 0  # bytes of the current head reported by the parser's callbacks
        self._fields = 0  # header fields of the current head
        self._completed = 0  # requests whose message ended
        self._received = 0  # bytes received since the current request's first byte
        self._read_timer: asyncio.TimerHandle | None = None
        self._linger: Linger | None = None

    # -- connection ----------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows it too
        remote = get_remote_addr(transport)
        self._address = address_key(None if remote is None else remote[0])
        if not self.guard.admit(self._address):
            # Accepted, then closed: leaving it in the backlog would fill the queue for
            # everyone, and refusing is all a flood should cost.
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)
        # uvicorn arms no timer before the first request: an idle new connection gets the
        # keep-alive timeout, like an idle one between requests.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self.guard.release(self._address)
        self._stop_read_clock()
        if self._linger is not None:
            self._linger.cancel()
        self._unset_keepalive_if_required()  # uvicorn leaves it armed when exc is set
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            if self._linger is not None:
                self._linger.received()
            return  # refused or answered early: read and discarded until the linger ends
        self._unset_keepalive_if_required()
        if self._read_timer is None:
            self._start_read_clock()
        self._received += len(data)
        view = memoryview(data)
        limit = self.guard.limits.max_header_bytes
        while view:
            in_head = not self._in_body
            if in_head:
                room = limit - self._head_fed
                if room <= 0:
                    self._refuse_headers()
                    return
                chunk, view = view[:room], view[room:]
            else:
                chunk, view = view, view[:0]
            completed = self._completed
            if not self._feed(chunk):
                return
            if self._completed != completed and not self._in_body:
                # A request ended inside the chunk and the next may have begun there, at an
                # offset the parser does not tell: count what its callbacks reported.
                self._head_fed = self._head_seen
            elif in_head and not self._in_body:
                self._head_fed += len(chunk)

    def _feed(self, chunk: memoryview) -> bool:
        """Feed the parser; ``False`` when the connection is done with (refused, bad request, upgrade)."""
        try:
            self.parser.feed_data(chunk)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError:
            if self._closing:
                return False  # _Refused raised by a callback of ours
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            self._closing = True
            self._stop_read_clock()
            return False
        return not self._closing

    # -- parser callbacks ----------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_seen = self._fields = 0
        if self._read_timer is None:  # a pipelined request, begun inside the chunk that ended the last
            self._start_read_clock()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 3)  # at least ":" and CRLF
        self._fields += 1
        if self._fields > self.guard.limits.max_header_fields:
            self._refuse_headers(f"headers: more than {self.guard.limits.max_header_fields} fields")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_body = True
        self._head_fed = 0
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:  # None, or not made: an upgrade
            cycle.transport = cast(asyncio.Transport, CycleTransport(self.transport, self._close_after_answer))

    def on_message_complete(self) -> None:
        self._in_body = False
        self._head_fed = self._head_seen = self._fields = 0
        self._completed += 1
        self._stop_read_clock()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._closing:  # lingering: no keep-alive timer, no pipelined request
            self.server_state.total_requests += 1
            return
        super().on_response_complete()

    def _count_head(self, size: int) -> None:
        self._head_seen += size
        if self._head_seen > self.guard.limits.max_header_bytes:
            self._refuse_headers()
            raise _Refused

    # -- refusals ------------------------------------------------------------

    def _start_read_clock(self) -> None:
        self._received = 0
        self._read_timer = self.loop.call_later(self.guard.limits.read_timeout_seconds, self._read_timed_out)

    def _stop_read_clock(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _refuse_headers(self, detail: str | None = None) -> None:
        limit = self.guard.limits.max_header_bytes
        self.guard.refused(
            "headers_too_large",
            peer=self._peer(),
            bytes_received=self._received,
            fields=self._fields,
            limit=limit,
        )
        self._shut("Request header fields too large", 431, detail or f"headers: larger than {limit} bytes")

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self._closing:
            return
        timeout = self.guard.limits.read_timeout_seconds
        answered = self._can_answer()
        self.guard.refused(
            "read_timeout",
            peer=self._peer(),
            bytes_received=self._received,
            timeout_s=timeout,
            answered=answered,
        )
        self._shut("Request timeout", 408, f"request: not received within {timeout:g} seconds")

    def _can_answer(self) -> bool:
        """Whether an answer now would be the next thing the client reads (no response under way)."""
        if self.pipeline:
            return False
        if self.cycle is None:
            return True
        if self._in_body:  # the cycle is this request's
            return not self.cycle.response_started
        return self.cycle.response_complete  # the cycle is the previous request's

    def _shut(self, title: str, status: int, detail: str) -> None:
        """Answer (when nothing else is being answered), half-close, discard what comes, close."""
        answer = self._can_answer()
        self._closing = True
        self._stop_read_clock()
        self._unset_keepalive_if_required()
        cycles = [self.cycle, *(cycle for cycle, _ in self.pipeline)]
        self.pipeline.clear()
        for cycle in cycles:
            if cycle is not None and not cycle.response_complete:
                # The app gets http.disconnect from receive() and its sends are dropped;
                # what uvicorn buffered of the body goes now, not with the connection.
                cycle.disconnected = True
                cycle.body = bytearray()
                cycle.message_event.set()
        if answer and not self.transport.is_closing():
            self.transport.write(self._problem(status, title, detail))
        self._linger_close()

    def _close_after_answer(self) -> None:
        """uvicorn closes the connection after an answer (not kept alive) or an app error."""
        if self._closing:
            return  # lingering already (it ends the connection), or closed
        if self._in_body:
            # The body is still arriving: closing with it unread would reset the connection,
            # and the client, still sending, would never read the answer (a 413, say).
            self._closing = True
            self._stop_read_clock()
            self._unset_keepalive_if_required()
            self._linger_close()
        else:
            self.transport.close()

    def _linger_close(self) -> None:
        """Half-close, then read and discard until the client is done (:class:`~taskmesh.api.linger.Linger`)."""
        self._linger = Linger.start(self.loop, self.transport)
        if self._linger is not None:
            self.flow.resume_reading()

    def _problem(self, status: int, title: str, detail: str) -> bytes:
        body = orjson.dumps({"type": PROBLEM_TYPE, "title": title, "status": status, "detail": detail})
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/problem+json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
        return b"".join(head)

    def _peer(self) -> str | None:
        return None if self.client is None else f"{self.client[0]}:{self.client[1]}"


class Server(uvicorn.Server):
    """uvicorn without its own signal handling: the supervisor owns signals.

    :param guard: the limits' shared state when built by :func:`make_server`; its
        pending log counts are written when the server shuts down.
    """

    def __init__(self, config: uvicorn.Config, guard: ConnectionGuard | None = None) -> None:
        super().__init__(config)
        self.guard = guard

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets)
        finally:
            if self.guard is not None:
                self.guard.close()

    @property
    def open_connections(self) -> int:
        """Connections counted against ``max_connections`` now (0 without limits)."""
        return 0 if self.guard is None else self.guard.open


def bind_http(host: str, port: int, setting: str = "http_port") -> socket.socket:
    """Bind a listening socket (the API's, or the metrics port's) before anything else starts.

    :param setting: the setting named when it cannot be bound (``http_port``, ``metrics_port``).
    :raises ConfigError: the address cannot be bound (in use, not local), naming ``setting``.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so, and
    # without it a keep-alive client waits ~40 ms per answer (Nagle against delayed ACKs).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{setting}: cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def make_server(
    app: ASGIApp,
    *,
    limits: HttpLimits,
    metrics: Metrics | None,
    timeout_graceful_shutdown: int = 3,
    timeout_keep_alive: int = 5,
) -> Server:
    """A :class:`Server` for ``app`` that enforces ``limits``; serve it with ``await server.serve([sock])``.

    Also raises the process's soft open-files limit (:func:`raise_open_files_limit`).

    :param metrics: where refusals are counted (``taskmesh_http_refused_total``); ``None`` counts nothing.
    :param timeout_graceful_shutdown: seconds running requests get when the server stops.
    :param timeout_keep_alive: seconds an idle connection is kept, before its first request
        and between requests.
    """
    soft = raise_open_files_limit()
    if soft is not None and soft < limits.max_connections + FD_HEADROOM:
        log.warning("fd_limit_low", soft=soft, max_connections=limits.max_connections, headroom=FD_HEADROOM)
    guard = ConnectionGuard(limits, metrics)

    class Protocol(BoundedHttpProtocol):
        pass

    Protocol.guard = guard
    config = uvicorn.Config(
        app,
        http=Protocol,
        # No WebSocket routes; and an upgraded connection would leave the protocol that counts it.
        ws="none",
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=timeout_graceful_shutdown,
        timeout_keep_alive=timeout_keep_alive,
    )
    return Server(config, guard)


def raise_open_files_limit() -> int | None:
    """Raise the soft ``RLIMIT_NOFILE`` of the process to its hard limit.

    Logs ``fd_limit`` at debug with the values. A hard limit of "unlimited" (macOS)
    is not a value the soft limit may take: it is then left as it is.

    :returns: the soft limit in force afterwards; ``None`` when it is unlimited.
    """
    soft_before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = soft_before
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.debug("fd_limit_unchanged", soft=soft, hard=hard, error=str(exc))
    log.debug("fd_limit", soft_before=soft_before, soft=soft, hard=hard)
    return None if soft == resource.RLIM_INFINITY else soft
