"""taskmesh as a real process: signals, graceful shutdown, stores down, the dev profile."""

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

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.anyio


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


def wait_until(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (urllib.error.URLError, ConnectionError, OSError):
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, **env: str) -> tuple[subprocess.Popen[str], int]:
        port = free_port()
        full = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("TASKMESH_") and k not in ("DATABASE_URL", "REDIS_URL")
        }
        full.update({"HTTP_PORT": str(port), "PYTHONPATH": str(ROOT), "TASKMESH_LOG_FORMAT": "json", **env})
        proc = subprocess.Popen(
            [sys.executable, "-m", "taskmesh", *args],
            env=full,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(proc)
        return proc, port

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop(proc: subprocess.Popen[str], timeout: float) -> tuple[int, float, str]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, time.monotonic() - t0, out


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


@pytest.mark.usefixtures("pool", "redis_client")
async def test_sigterm_drains_an_in_flight_run_writes_its_result_and_exits_0(
    spawn: Any, database_url: str, redis_url: str, prefix: str
) -> None:
    proc, port = spawn(**stores_env(database_url, redis_url, prefix))
    wait_until(lambda: call(port, "GET", "/readyz")[0] == 200)
    status, body = call(port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 1.5}})
    assert status == 201
    tid = body["task_id"]
    wait_until(lambda: task_status(port, tid)["task"]["status"] == "running")
    proc.send_signal(signal.SIGTERM)
    assert wait_until(
        lambda: (
            call(port, "GET", "/readyz") == (503, {"ready": False, "postgres": "ok", "redis": "ok", "draining": True})
        ),
        2,
    )
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert '"event": "shutdown_requested"' in out and '"event": "instance_stopped"' in out


@pytest.mark.usefixtures("redis_client")
async def test_a_run_still_going_after_the_grace_period_is_handed_back_without_spending_a_retry(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: Any
) -> None:
    proc, port = spawn(**stores_env(database_url, redis_url, prefix, TASKMESH_SHUTDOWN_GRACE_SECONDS="0.5"))
    wait_until(lambda: call(port, "GET", "/readyz")[0] == 200)
    _, body = call(port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 60}, "max_retries": 0})
    tid = body["task_id"]
    wait_until(lambda: task_status(port, tid)["task"]["status"] == "running")
    code, took, out = stop(proc, 15)
    assert code == 0, out
    assert took < 5.5  # grace + 5 s
    assert '"event": "runs_handed_back"' in out
    task = await pool.fetchrow("SELECT status, retries FROM tasks WHERE id = $1", tid)
    run = await pool.fetchrow("SELECT status, error FROM task_runs WHERE task_id = $1", tid)
    assert task["status"] == "queued" and task["retries"] == 0
    assert run["status"] == "retrying"
    assert run["error"] == "interrupted: instance shut down before the run finished"


async def test_with_postgres_down_the_instance_stays_up_says_503_and_names_the_store(
    spawn: Any, redis_url: str
) -> None:
    proc, port = spawn(DATABASE_URL="postgresql://postgres@127.0.0.1:1/none", REDIS_URL=redis_url)
    assert wait_until(lambda: call(port, "GET", "/readyz")) == (
        503,
        {"ready": False, "postgres": "down", "redis": "down"},
    )
    assert call(port, "GET", "/healthz") == (200, {"status": "ok"})
    status, body = call(port, "POST", "/api/v1/tasks", {"name": "x"})
    assert status == 503 and body["title"] == "Not ready"
    code, _, out = stop(proc, 10)
    assert code == 0, out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    down = [line for line in lines if line["event"] == "store_unavailable"]
    assert len(down) == 1 and down[0]["service"] == "postgres"


async def test_dev_profile_starts_embedded_servers_and_sigterm_leaves_none_behind(spawn: Any, tmp_path: Path) -> None:
    dev_dir = tmp_path / "devdata"
    proc, port = spawn("dev", TASKMESH_DEV_DIR=str(dev_dir))
    wait_until(lambda: call(port, "GET", "/readyz")[0] == 200, timeout=60)
    status, body = call(port, "POST", "/api/v1/tasks", {"name": "anything", "priority": 2, "payload": {"k": "v"}})
    assert status == 201
    tid = body["task_id"]
    wait_until(lambda: task_status(port, tid)["task"]["status"] == "completed")
    code, took, out = stop(proc, 15)
    assert code == 0, out
    assert took < 10
    leftovers = subprocess.run(["pgrep", "-f", str(dev_dir)], capture_output=True, text=True).stdout.split()
    assert leftovers == []
