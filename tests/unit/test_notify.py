"""sd_notify: the datagrams taskmesh.runtime.notify sends to a real AF_UNIX socket, and when it sends none."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator

import anyio
import pytest
import structlog

from taskmesh.runtime import notify


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket bound at a short path (sun_path holds 108 bytes), named by NOTIFY_SOCKET."""
    folder = tempfile.mkdtemp(prefix="tmn-")
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    for name in ("WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield sock
    sock.close()
    shutil.rmtree(folder)


def drain(sock: socket.socket) -> list[str]:
    out = []
    sock.settimeout(0.05)
    try:
        while True:
            out.append(sock.recv(4096).decode())
    except TimeoutError:
        return out


def test_without_notify_socket_nothing_is_sent_and_nothing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    notify.ready("x")
    notify.stopping("y")
    notify.status("z")
    assert notify.watchdog_interval() is None


def test_ready_stopping_and_status_are_one_datagram_each(receiver: socket.socket) -> None:
    notify.status("connecting")
    notify.ready("ready: 4 executors on default")
    notify.stopping("draining 2 runs, grace 30 s")
    notify.ready()
    assert drain(receiver) == [
        "STATUS=connecting\n",
        "READY=1\nSTATUS=ready: 4 executors on default\n",
        "STOPPING=1\nSTATUS=draining 2 runs, grace 30 s\n",
        "READY=1\n",
    ]


def test_an_abstract_namespace_socket_is_reached_through_its_at_sign(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"taskmesh-test-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(f"\0{name}")
        monkeypatch.setenv("NOTIFY_SOCKET", f"@{name}")
        notify.ready()
        assert drain(sock) == ["READY=1\n"]


@pytest.mark.parametrize(
    ("usec", "pid", "interval"),
    [
        ("3000000", None, 1.5),
        ("3000000", "self", 1.5),
        ("3000000", "1", None),  # the watchdog is for another process
        ("0", None, None),
        ("soon", None, None),
        (None, None, None),
    ],
)
def test_the_watchdog_interval_is_half_of_watchdog_usec_for_this_process_only(
    receiver: socket.socket, monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, interval: float | None
) -> None:
    if usec is not None:
        monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is not None:
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)
    assert notify.watchdog_interval() == interval


@pytest.mark.anyio
async def test_the_watchdog_pings_only_while_healthy(receiver: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "40000")  # a ping every 20 ms
    healthy = True
    with anyio.move_on_after(0.3):
        await notify.watchdog(lambda: healthy)
    pings = drain(receiver)
    assert 5 <= len(pings) <= 20 and set(pings) == {"WATCHDOG=1\n"}
    healthy = False
    with anyio.move_on_after(0.2):
        await notify.watchdog(lambda: healthy)
    assert drain(receiver) == []


@pytest.mark.anyio
async def test_the_watchdog_returns_at_once_when_off(receiver: socket.socket) -> None:
    with anyio.fail_after(1):
        await notify.watchdog(lambda: True)
    assert drain(receiver) == []


def test_a_vanished_socket_is_logged_once_and_never_raises(receiver: socket.socket) -> None:
    os.unlink(receiver.getsockname())
    with structlog.testing.capture_logs() as logs:
        notify.ready()
        notify.status("still here")
        notify.stopping()
    assert [e["event"] for e in logs] == ["sd_notify_failed"]


def test_the_notify_socket_may_change_between_instances(
    receiver: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    notify.ready()
    assert drain(receiver) == ["READY=1\n"]
    folder = tempfile.mkdtemp(prefix="tmn-")
    try:
        other = os.path.join(folder, "n")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(other)
            monkeypatch.setenv("NOTIFY_SOCKET", other)
            notify.ready()
            assert drain(sock) == ["READY=1\n"]
    finally:
        shutil.rmtree(folder)
