"""The instance's HTTP listeners: the API's port, and ``metrics_port`` when it is set.

Each listener is a bound socket and the bounded uvicorn :class:`~taskmesh.api.server.Server`
that serves it; the supervisor starts every one in its root task group and stops them together.
The sockets are bound before anything else starts, so a port in use fails the start at once,
naming its setting.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import anyio

from taskmesh.api.app import create_app
from taskmesh.api.hygiene import LOOPBACK_HOSTS
from taskmesh.api.policy import is_loopback
from taskmesh.api.server import HttpLimits, Server, bind_http, make_server
from taskmesh.api.state import AppState
from taskmesh.config import Settings
from taskmesh.observability.metrics import Metrics

STOP_WAIT_SECONDS = 5.0
"""How long a stopping listener waits for its server to finish (its running requests get 3 s)."""


@dataclass
class HttpListener:
    """One bound socket and the server answering on it.

    :ivar name: ``http`` (the API's port) or ``metrics``.
    :ivar host: the address it listens on, for logs.
    :ivar port: the bound port (the actual one when the setting was 0).
    """

    name: str
    host: str
    server: Server
    sock: socket.socket
    done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self.sock.getsockname()[1])

    async def serve(self) -> None:
        """Serve until :meth:`stop`; ``done`` is set however it ends."""
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            self.done.set()

    async def stop(self) -> None:
        """Ask the server to finish and wait for it, at most :data:`STOP_WAIT_SECONDS`."""
        self.server.should_exit = True
        with anyio.move_on_after(STOP_WAIT_SECONDS):
            await self.done.wait()


def bind_listeners(settings: Settings, state: AppState, metrics: Metrics) -> list[HttpListener]:
    """Bind the API's port and, when ``metrics_port`` is set, the metrics port; the API's comes first.

    With ``metrics_port`` set, ``/metrics`` is served there only (with ``/healthz`` and ``/readyz``,
    under the same ``metrics_auth``), and the API's port answers it 404.

    :raises ConfigError: a port cannot be bound, naming ``http_port`` or ``metrics_port``.
    """
    limits = HttpLimits.from_settings(settings)
    apart = settings.metrics_port is not None
    app = create_app(
        state,
        api_enabled=settings.api_enabled,
        allowed_hosts=allowed_hosts(settings, settings.http_host),
        serve_metrics=not apart,
        cors_allowed_origins=settings.cors_allowed_origins,
        console_enabled=settings.console_enabled,
    )
    sock = bind_http(settings.http_host, settings.http_port)
    listeners = [HttpListener("http", settings.http_host, make_server(app, limits=limits, metrics=metrics), sock)]
    if settings.metrics_port is not None:
        host = settings.metrics_host or settings.http_host
        try:
            msock = bind_http(host, settings.metrics_port, setting="metrics_port")
        except BaseException:
            sock.close()
            raise
        mapp = create_app(state, api_enabled=False, allowed_hosts=allowed_hosts(settings, host))
        listeners.append(HttpListener("metrics", host, make_server(mapp, limits=limits, metrics=metrics), msock))
    return listeners


def allowed_hosts(settings: Settings, host: str) -> list[str]:
    """``allowed_hosts``, or by default the loopback names for a loopback ``host`` and any name elsewhere."""
    if settings.allowed_hosts:
        return settings.allowed_hosts
    return list(LOOPBACK_HOSTS) if is_loopback(host) else ["*"]
