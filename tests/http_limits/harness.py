"""A real server on a loopback socket in the test's event loop, and blocking raw-socket clients.

Clients block, so tests run them in a worker thread (``anyio.to_thread.run_sync``)
while the server keeps serving in the event loop.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
from fastapi import FastAPI, Request

from taskmesh.api.limits import BodyLimit
from taskmesh.api.server import HttpLimits, Server, bind_http, make_server
from taskmesh.observability.metrics import Metrics


@dataclass
class Served:
    """A running server: its port, the server, its metrics, and the routes the app ran."""

    port: int
    server: Server
    metrics: Metrics
    calls: list[str] = field(default_factory=list)

    def refused(self, reason: str) -> float:
        """``taskmesh_http_refused_total{reason}`` now."""
        value = self.metrics.registry.get_sample_value("taskmesh_http_refused_total", {"reason": reason})
        assert value is not None
        return value

    async def wait_open(self, count: int, timeout: float = 3.0) -> None:
        """Wait until the server counts ``count`` open connections."""
        with anyio.fail_after(timeout):
            while self.server.open_connections != count:
                await anyio.sleep(0.01)


def tiny_app(calls: list[str]) -> FastAPI:
    """``GET /ok`` and ``POST /echo`` behind the body-limit middleware, as the API's routes are."""
    app = FastAPI()
    app.add_middleware(BodyLimit)

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        calls.append("ok")
        return {"ok": True}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        calls.append("echo")
        return {"bytes": len(await request.body())}

    return app


@contextlib.asynccontextmanager
async def serving(limits: HttpLimits, *, keep_alive: int = 5) -> AsyncIterator[Served]:
    """Serve :func:`tiny_app` with ``limits`` until the block ends."""
    metrics = Metrics()
    calls: list[str] = []
    sock = bind_http("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = make_server(tiny_app(calls), limits=limits, metrics=metrics, timeout_keep_alive=keep_alive)
    served = Served(port, server, metrics, calls)
    stopped = anyio.Event()

    async def serve() -> None:
        try:
            await server.serve([sock])
        finally:
            stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        with anyio.fail_after(5):
            while not server.started:
                await anyio.sleep(0.01)
        try:
            yield served
        finally:
            server.should_exit = True
            with anyio.fail_after(10):
                await stopped.wait()


# -- blocking clients -----------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Client:
    """A raw HTTP/1.1 connection that reads responses one at a time (pipelined ones too)."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = connect(port, timeout)
        self.buffer = b""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, what: str) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed {what}; got {self.buffer[:200]!r}")
        self.buffer += chunk

    def response(self) -> Response:
        """The next response (Content-Length framed); ``ConnectionError`` if the connection ends first."""
        while b"\r\n\r\n" not in self.buffer:
            self._fill("before a response")
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._fill("inside a response body")
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return Response(int(status_line.split()[1]), headers, body)

    def closed_by_server(self, timeout: float) -> bool:
        """Whether the server ends the connection (EOF or reset) within ``timeout`` seconds; data is skipped."""
        return closed_by_server(self.sock, timeout)


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server ends the connection (EOF or reset) within ``timeout`` seconds; data is skipped."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


def request(path: str = "/ok", method: str = "GET", headers: str = "", body: bytes = b"") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
    return f"{method} {path} HTTP/1.1\r\nHost: test\r\n{length}{headers}\r\n".encode() + body


def rss_kib(key: str = "VmRSS") -> int:
    """This process's resident memory (``VmRSS``) or its peak (``VmHWM``), KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0); ``False`` where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True
