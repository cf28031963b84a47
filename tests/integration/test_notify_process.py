"""The sd_notify protocol of a real ``python -m taskmesh`` against a real AF_UNIX datagram socket.

The test plays systemd's part: it binds the socket named by ``NOTIFY_SOCKET``,
sets ``WATCHDOG_USEC`` as ``WatchdogSec=`` would, and reads what the instance
sends: READY=1 once ``/readyz`` says 200, WATCHDOG=1 every half
``WATCHDOG_USEC`` (also while draining), STOPPING=1 once SIGTERM arrived.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.proc import call, spawn, stores_env, task_status, wait_until

__all__ = ["spawn"]  # a fixture, used by name

pytestmark = pytest.mark.anyio


class NotifySocket:
    """A bound datagram socket and a thread that records ``(monotonic time, message)``."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="tmn-")  # short: sun_path holds 108 bytes
        self.path = os.path.join(self.folder, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self.on_ready: Any = None
        self.ready_seen: list[Any] = []
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.closing.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            message, at = data.decode(), time.monotonic()
            if "READY=1" in message.splitlines() and self.on_ready is not None:
                self.ready_seen.append(self.on_ready())  # what /readyz says the moment READY=1 arrives
            self.messages.append((at, message))

    def lines(self, since: float = 0.0) -> list[str]:
        return [line for t, m in list(self.messages) if t >= since for line in m.splitlines()]

    def times_of(self, line: str) -> list[float]:
        return [t for t, m in list(self.messages) if line in m.splitlines()]

    def close(self) -> None:
        self.closing.set()
        self.thread.join(2)
        self.sock.close()
        shutil.rmtree(self.folder)


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    ns = NotifySocket()
    yield ns
    ns.close()


@pytest.mark.usefixtures("pool", "redis_client")
async def test_ready_after_readyz_watchdog_pings_and_stopping_on_sigterm(
    spawn: Any, database_url: str, redis_url: str, prefix: str, notify_socket: NotifySocket
) -> None:
    env = stores_env(database_url, redis_url, prefix, NOTIFY_SOCKET=notify_socket.path, WATCHDOG_USEC="400000")
    proc = spawn(**env)
    notify_socket.on_ready = lambda: call(proc.port, "GET", "/readyz")[0]
    wait_until(lambda: notify_socket.times_of("READY=1"), proc=proc)
    assert notify_socket.ready_seen == [200], notify_socket.messages
    lines = notify_socket.lines()
    assert any(line.startswith("STATUS=connecting") for line in lines)
    assert any(line.startswith("STATUS=ready: 1 executors on default") for line in lines)

    # WATCHDOG=1 every 0.2 s (half of 0.4 s), from start-up on.
    ready_at = notify_socket.times_of("READY=1")[0]
    time.sleep(1.2)
    pings = [t for t in notify_socket.times_of("WATCHDOG=1") if t >= ready_at]
    assert 4 <= len(pings) <= 8, pings
    assert max(b - a for a, b in itertools.pairwise(pings)) < 0.4

    # A slow run keeps the drain going for a second: the pings go on, STOPPING=1 comes at once.
    _, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 1.2}})
    tid = body["task_id"]
    wait_until(lambda: task_status(proc.port, tid)["task"]["status"] == "running", proc=proc)
    signalled = time.monotonic()
    proc.signal(signal.SIGTERM)
    wait_until(lambda: notify_socket.times_of("STOPPING=1"), timeout=2)
    assert notify_socket.times_of("STOPPING=1")[0] - signalled < 0.5
    assert any(line.startswith("STATUS=draining 1 runs") for line in notify_socket.lines())
    assert proc.wait(15) == 0, proc.output()
    exited = time.monotonic()
    assert exited - signalled >= 1.0  # the run was waited for
    draining_pings = [t for t in notify_socket.times_of("WATCHDOG=1") if signalled < t < exited]
    assert len(draining_pings) >= 3, draining_pings
    assert notify_socket.lines().count("READY=1") == 1 and notify_socket.lines().count("STOPPING=1") == 1


async def test_without_watchdog_usec_there_are_no_pings_and_stopping_comes_even_before_the_stores(
    spawn: Any, redis_url: str, notify_socket: NotifySocket
) -> None:
    proc = spawn(
        DATABASE_URL="postgresql://postgres@127.0.0.1:1/none", REDIS_URL=redis_url, NOTIFY_SOCKET=notify_socket.path
    )
    wait_until(lambda: any(line.startswith("STATUS=connecting") for line in notify_socket.lines()), proc=proc)
    time.sleep(0.5)
    proc.signal(signal.SIGTERM)
    assert proc.wait(10) == 0, proc.output()
    lines = notify_socket.lines()
    assert "READY=1" not in lines and "WATCHDOG=1" not in lines
    assert "STOPPING=1" in lines
