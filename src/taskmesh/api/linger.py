"""Closing an HTTP connection without losing its answer: half-close, read and discard, then close.

A server that closes a TCP socket with input still unread makes the kernel send a reset, and a
reset destroys what the client has not read yet, the answer included. That happens whenever the
server answers before the request's body has arrived: a 413 for a body over the limit (the
answer comes from ``Content-Length``), a 431, a 408. A client that sends its whole body before
reading (urllib, requests, http.client) then sees a broken pipe or "connection reset" in place
of the answer. So the server half-closes (its FIN follows the answer), keeps reading and
discarding, and closes once the client closed its side, or once the client has been quiet for
:data:`LINGER_SECONDS`, or :data:`LINGER_MAX_SECONDS` after it began in all (nginx's lingering
close does the same with 5 s and 30 s). Draining costs bandwidth, never memory: nothing read is
kept, and the connection still counts against the connection caps until it closes.

:class:`Linger` is one connection's lingering close; :class:`CycleTransport` is the transport
as uvicorn's request cycle sees it, so that the close uvicorn makes after answering a request
that asked for ``Connection: close`` becomes a lingering one while its body is still arriving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["LINGER_MAX_SECONDS", "LINGER_SECONDS", "CycleTransport", "Linger"]

LINGER_SECONDS = 2.0
"""Longest a lingering connection waits for more of the client's bytes (or its close), seconds."""
LINGER_MAX_SECONDS = 30.0
"""Longest a connection lingers in all, however steadily the client keeps sending, seconds."""


class Linger:
    """A connection half-closed by the server, read and discarded until it ends (see module docs).

    Made by :meth:`start`; the protocol resumes reading, drops what arrives, calls
    :meth:`received` for it, and :meth:`cancel` when the connection is lost.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport) -> None:
        self.loop = loop
        self.transport = transport
        now = loop.time()
        self.last = now
        self.deadline = now + LINGER_MAX_SECONDS
        self.timer: asyncio.TimerHandle | None = loop.call_at(min(now + LINGER_SECONDS, self.deadline), self._check)

    @classmethod
    def start(cls, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport) -> Linger | None:
        """Half-close ``transport`` (what was written goes first) and linger on it.

        :returns: the linger; ``None`` when the transport is closing already, or cannot be
            half-closed (TLS, or the client reset it already): it is then closed at once.
        """
        if transport.is_closing():
            return None
        if not transport.can_write_eof():
            transport.close()
            return None
        try:
            transport.write_eof()
        except OSError:  # reset by the client (it read its answer and left): nothing to wait for
            transport.close()
            return None
        return cls(loop, transport)

    def received(self) -> None:
        """The client sent more (discarded): the quiet period starts again."""
        self.last = self.loop.time()

    def cancel(self) -> None:
        """The connection ended: stop the timer."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check(self) -> None:
        end = min(self.last + LINGER_SECONDS, self.deadline)
        if self.loop.time() >= end:
            self.timer = None
            self.transport.abort()
        else:
            self.timer = self.loop.call_at(end, self._check)


class CycleTransport:
    """A connection's transport as one request's cycle sees it: the same, but ``close`` is ``on_close``.

    uvicorn's cycle closes the transport itself after an answer to a request that is not kept
    alive (``Connection: close``, HTTP/1.0) or after an app error; through this, the protocol
    decides how (at once, or lingering while the request's body is still arriving).
    """

    def __init__(self, transport: asyncio.Transport, on_close: Callable[[], None]) -> None:
        self._transport = transport
        self._on_close = on_close

    def close(self) -> None:
        """Close the connection as the protocol decides."""
        self._on_close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
