"""taskmesh as a real process: signals, graceful shutdown, stores down, the dev profile."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import taskmesh
from tests.proc import call, spawn, stop, stores_env, task_status, wait_until

__all__ = ["spawn"]  # a fixture, used by name

pytestmark = pytest.mark.anyio


@pytest.mark.usefixtures("pool", "redis_client")
async def test_sigterm_drains_an_in_flight_run_writes_its_result_and_exits_0(
    spawn: Any, database_url: str, redis_url: str, prefix: str
) -> None:
    proc = spawn(**stores_env(database_url, redis_url, prefix))
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, proc=proc)
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 1.5}})
    assert status == 201
    tid = body["task_id"]
    wait_until(lambda: task_status(proc.port, tid)["task"]["status"] == "running")
    proc.signal(signal.SIGTERM)
    assert wait_until(
        lambda: (
            call(proc.port, "GET", "/readyz")
            == (503, {"ready": False, "postgres": "ok", "redis": "ok", "draining": True})
        ),
        2,
    )
    assert proc.wait(15) == 0, proc.output()
    out = proc.output()
    assert '"event": "shutdown_requested"' in out and '"event": "instance_stopped"' in out


@pytest.mark.usefixtures("redis_client")
async def test_a_run_still_going_after_the_grace_period_is_handed_back_without_spending_a_retry(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: Any
) -> None:
    proc = spawn(**stores_env(database_url, redis_url, prefix, TASKMESH_SHUTDOWN_GRACE_SECONDS="0.5"))
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, proc=proc)
    _, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 60}, "max_retries": 0})
    tid = body["task_id"]
    wait_until(lambda: task_status(proc.port, tid)["task"]["status"] == "running")
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
    proc = spawn(DATABASE_URL="postgresql://postgres@127.0.0.1:1/none", REDIS_URL=redis_url)

    def settled() -> Any:
        answer = call(proc.port, "GET", "/readyz")
        return answer if "connecting" not in answer[1].values() else None

    # Only the store that does not answer reads "down"; Redis answered.
    assert wait_until(settled) == (503, {"ready": False, "postgres": "down", "redis": "ok"})
    assert call(proc.port, "GET", "/healthz") == (200, {"status": "ok", "version": taskmesh.__version__})
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "x"})
    assert status == 503 and body["title"] == "Not ready"
    code, _, out = stop(proc, 10)
    assert code == 0, out
    down = [e for e in proc.events() if e["event"] == "store_unavailable"]
    assert len(down) == 1 and down[0]["service"] == "postgres"


async def test_dev_profile_starts_embedded_servers_and_sigterm_leaves_none_behind(spawn: Any, tmp_path: Path) -> None:
    dev_dir = tmp_path / "devdata"
    proc = spawn("dev", TASKMESH_DEV_DIR=str(dev_dir))
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=90, proc=proc)
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "anything", "priority": 2, "payload": {"k": "v"}})
    assert status == 201
    tid = body["task_id"]
    wait_until(lambda: task_status(proc.port, tid)["task"]["status"] == "completed")
    code, took, out = stop(proc, 15)
    assert code == 0, out
    assert took < 10
    leftovers = subprocess.run(["pgrep", "-f", str(dev_dir)], capture_output=True, text=True).stdout.split()
    assert leftovers == []
