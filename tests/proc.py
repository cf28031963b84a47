"""Helpers for tests that run taskmesh as real processes (signals, kill -9, SIGSTOP)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_until(check: Any, timeout: float = 20.0, proc: Proc | None = None) -> Any:
    """Poll ``check`` until truthy; fail after ``timeout`` s, or at once when ``proc`` died (with its log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (urllib.error.URLError, ConnectionError, OSError):
            value = None
        if value:
            return value
        if proc is not None and not proc.alive():
            raise AssertionError(
                f"the process exited with {proc.popen.returncode}; its output:\n{proc.output()[-3000:]}"
            )
        time.sleep(0.05)
    tail = f"; its output:\n{proc.output()[-3000:]}" if proc is not None else ""
    raise AssertionError(f"not within {timeout} s{tail}")


class Proc:
    """A taskmesh process started by :func:`spawn`, its HTTP port and its log file.

    :param pid: the taskmesh process when ``popen`` is a wrapper that forked it (faketime);
        signals go to it, and the wrapper's exit status is its own.
    """

    def __init__(self, popen: subprocess.Popen[bytes], port: int, log: Path, pid: int | None = None) -> None:
        self.popen = popen
        self.port = port
        self.log = log
        self.pid = popen.pid if pid is None else pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.output().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return out

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.pid == self.popen.pid:
            self.popen.send_signal(sig)
        elif self.alive():  # the wrapper waits for its child: while it runs, the pid is still its child's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process (and its wrapper), and reap it."""
        self.signal(signal.SIGKILL)
        self.popen.kill()
        self.popen.wait()

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Start ``python -m taskmesh ...`` with a clean environment plus ``env``; killed at teardown.

    ``wrap`` is a command the process runs under that forks it and waits for it, passing on
    its exit status (``["faketime", "-f", "+10m"]``); the :class:`Proc` signals the forked
    process itself, since the wrapper does not pass signals on.
    """
    procs: list[Proc] = []

    def start(*args: str, wrap: Sequence[str] = (), **env: str) -> Proc:
        port = free_port()
        full = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("TASKMESH_") and k not in ("DATABASE_URL", "REDIS_URL")
        }
        full.update({"HTTP_PORT": str(port), "PYTHONPATH": str(ROOT), "TASKMESH_LOG_FORMAT": "json"})
        if os.environ.get("TASKMESH_TEST_PG_POOLER"):  # the pooler suite (tests/conftest.py)
            full["TASKMESH_PG_POOLER"] = os.environ["TASKMESH_TEST_PG_POOLER"]
        # The cluster suite; `dev` starts a standalone Valkey of its own.
        if os.environ.get("TASKMESH_TEST_REDIS_TOPOLOGY") == "cluster" and args[:1] != ("dev",):
            full["TASKMESH_REDIS_MODE"] = "cluster"
        full.update(env)
        log = tmp_path / f"taskmesh-{len(procs)}-{port}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [*wrap, sys.executable, "-m", "taskmesh", *args],
                env=full,
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(popen, port, log, _forked_child(popen) if wrap else None)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.alive():
            proc.kill()


def _forked_child(popen: subprocess.Popen[bytes], timeout: float = 5.0) -> int:
    """The pid of the one process a wrapper forked (Linux: ``/proc/PID/task/PID/children``)."""
    children = Path(f"/proc/{popen.pid}/task/{popen.pid}/children")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and popen.poll() is None:
        found = children.read_text().split()
        if found:
            return int(found[0])
        time.sleep(0.01)
    popen.kill()
    popen.wait()
    raise AssertionError(f"{popen.args!r} forked no process within {timeout} s (exit status {popen.returncode})")


def stop(proc: Proc, timeout: float) -> tuple[int, float, str]:
    """SIGTERM and wait: ``(exit status, seconds taken, output)``."""
    t0 = time.monotonic()
    proc.signal(signal.SIGTERM)
    code = proc.wait(timeout)
    return code, time.monotonic() - t0, proc.output()


def stores_env(database_url: str, redis_url: str, prefix: str, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "TASKMESH_REDIS_PREFIX": prefix,
        "TASKMESH_HANDLERS": "tests.process_handlers",
        **extra,
    }


def create(proc: Proc, body: dict[str, Any]) -> str:
    """``POST /api/v1/tasks`` ``body`` to ``proc``; the new task's id (a 201 is asserted)."""
    status, answer = call(proc.port, "POST", "/api/v1/tasks", body)
    assert status == 201, answer
    task_id: str = answer["task_id"]
    return task_id


def task_status(port: int, task_id: str) -> dict[str, Any]:
    status, body = call(port, "GET", f"/api/v1/tasks/{task_id}")
    assert status == 200
    result: dict[str, Any] = body
    return result


def running(pid: int) -> bool:
    """True while ``pid`` is a live process; a zombie (nobody reaps the daemonised servers here) is not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
