"""The dev profile's guard, on a real pipe and real processes (``sleep`` stands for a server), its loop in a thread."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from taskmesh.dev import embedded_guard
from taskmesh.dev.embedded_guard import guard, start_time


class Dev:
    """Dev's end of a pipe to a guard running in a thread of this process."""

    def __init__(self, parent: int | None = None) -> None:
        read, self.write = os.pipe()
        self.read = read
        self.result: list[int] = []
        self.thread = threading.Thread(
            target=lambda: self.result.append(guard(read, parent=parent or os.getppid(), check_seconds=0.05)),
            daemon=True,
        )
        self.thread.start()

    def track(self, name: str, server: subprocess.Popen[bytes], directory: Path, started: int | None = None) -> None:
        started = start_time(server.pid) if started is None else started
        line = {"name": name, "pid": server.pid, "started": started, "directory": str(directory)}
        os.write(self.write, f"{json.dumps(line)}\n".encode())

    def finished(self, timeout: float = 10.0) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def close(self) -> None:
        for fd in (self.write, self.read):
            try:
                os.close(fd)
            except OSError:
                pass


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for server in started:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


def server(started: list[subprocess.Popen[bytes]], ignore_sigterm: bool = False) -> subprocess.Popen[bytes]:
    """A process standing for a server; one that ignores SIGTERM, as Valkey whose final save fails."""
    code = "import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_sigterm else "")
    proc = subprocess.Popen([sys.executable, "-c", code + "print(flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline()  # its signal handler is in place
    started.append(proc)
    return proc


def ended_by(proc: subprocess.Popen[bytes]) -> int | None:
    """The signal that ended ``proc``, waiting up to 10 s; None while it runs."""
    try:
        code = proc.wait(10)
    except subprocess.TimeoutExpired:
        return None
    return -code


def test_the_end_of_the_pipe_without_a_release_stops_every_server_with_its_polite_signal(
    servers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    valkey, postgres = server(servers), server(servers)
    dev = Dev()
    dev.track("valkey", valkey, tmp_path)
    dev.track("postgres", postgres, tmp_path)
    with capture_logs() as logs:
        os.close(dev.write)  # what a dev killed with SIGKILL leaves
        assert dev.finished()
    assert (ended_by(valkey), ended_by(postgres)) == (signal.SIGTERM, signal.SIGINT)
    assert {(e["server"], e["reason"], e["signal"]) for e in logs} == {
        ("valkey", "dev process died", "SIGTERM"),
        ("postgres", "dev process died", "SIGINT"),
    }
    dev.close()


def test_a_release_ends_the_guard_and_leaves_the_servers_alone(
    servers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    valkey = server(servers)
    dev = Dev()
    dev.track("valkey", valkey, tmp_path)
    os.write(dev.write, b"release\n")
    os.close(dev.write)
    assert dev.finished() and dev.result == [0]
    assert valkey.poll() is None
    dev.close()


def test_a_removed_data_directory_stops_its_server_only_and_the_guard_goes_on(
    servers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    (tmp_path / "valkey").mkdir()
    (tmp_path / "pg").mkdir()
    valkey, postgres = server(servers), server(servers)
    dev = Dev()
    dev.track("valkey", valkey, tmp_path / "valkey")
    dev.track("postgres", postgres, tmp_path / "pg")
    (tmp_path / "valkey").rmdir()
    assert ended_by(valkey) == signal.SIGTERM
    assert postgres.poll() is None and not dev.finished(0.2)
    os.close(dev.write)
    assert dev.finished() and ended_by(postgres) == signal.SIGINT
    dev.close()


def test_a_server_that_ignores_its_polite_signal_is_killed_after_the_grace(
    servers: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded_guard, "GRACE_SECONDS", 0.5)
    stubborn = server(servers, ignore_sigterm=True)
    dev = Dev()
    dev.track("valkey", stubborn, tmp_path)
    with capture_logs() as logs:
        os.close(dev.write)
        assert dev.finished()
    assert ended_by(stubborn) == signal.SIGKILL
    assert [e["signal"] for e in logs] == ["SIGKILL"]
    dev.close()


def test_a_pid_that_names_another_process_now_is_not_signalled(
    servers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A reused pid: same number, another start time."""
    other = server(servers)
    dev = Dev()
    dev.track("valkey", other, tmp_path, started=(start_time(other.pid) or 0) - 1)
    os.close(dev.write)
    assert dev.finished()
    assert other.poll() is None
    dev.close()


def test_a_guard_whose_parent_changed_stops_the_servers_though_the_pipe_is_still_open(
    servers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """As when a child forked by dev keeps the pipe's write end open after dev died."""
    valkey = server(servers)
    dev = Dev(parent=-1)
    dev.track("valkey", valkey, tmp_path)
    assert ended_by(valkey) == signal.SIGTERM
    assert dev.finished()
    dev.close()
