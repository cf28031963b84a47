"""Helpers for tests that run taskmesh as real processes (signals, kill -9, SIGSTOP)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
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
    """A taskmesh process started by :func:`spawn`, its HTTP port and its log file."""

    def __init__(self, popen: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.popen = popen
        self.port = port
        self.log = log
        self.pid = popen.pid

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
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Start ``python -m taskmesh ...`` with a clean environment plus ``env``; killed at teardown."""
    procs: list[Proc] = []

    def start(*args: str, **env: str) -> Proc:
        port = free_port()
        full = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("TASKMESH_") and k not in ("DATABASE_URL", "REDIS_URL")
        }
        full.update({"HTTP_PORT": str(port), "PYTHONPATH": str(ROOT), "TASKMESH_LOG_FORMAT": "json", **env})
        log = tmp_path / f"taskmesh-{len(procs)}-{port}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "taskmesh", *args], env=full, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT
            )
        proc = Proc(popen, port, log)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.alive():
            proc.popen.kill()
            proc.popen.wait()


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


def task_status(port: int, task_id: str) -> dict[str, Any]:
    status, body = call(port, "GET", f"/api/v1/tasks/{task_id}")
    assert status == 200
    result: dict[str, Any] = body
    return result
