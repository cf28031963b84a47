"""Serving the HTTP API: the listening socket, and uvicorn without its own signal handling."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import uvicorn

from taskmesh.errors import ConfigError

__all__ = ["Server", "bind_http"]


class Server(uvicorn.Server):
    """uvicorn without its own signal handling: the supervisor owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_http(host: str, port: int) -> socket.socket:
    """Bind the API's listening socket before anything else starts.

    :raises ConfigError: the address cannot be bound (in use, not local), naming ``http_port``.
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
        raise ConfigError(f"http_port: cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock
