"""``worker_processes``: one ``taskmesh run`` works its queues in several processes, real ones, signals and all."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.proc import Proc, call, create, spawn, stores_env, wait_until

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("redis_client")]

FAST = {"TASKMESH_LEASE_SECONDS": "1.5", "TASKMESH_RECLAIM_INTERVAL_SECONDS": "0.3", "TASKMESH_AUTH": "none"}


def free_run(count: int) -> int:
    """A port ``p`` such that ``p`` to ``p + count - 1`` are free now (the children take the ports after it).

    Below Linux's ephemeral range (32768 and up): polling a child's port before it listens would
    otherwise now and then connect the client to itself (a TCP self-connect, which answered the
    test's own request back and held the port the child was about to bind).
    """
    for _ in range(200):
        first = random.randrange(20000, 32768 - count)
        taken = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                taken.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in taken:
                sock.close()
    raise AssertionError(f"no {count} free ports in a row")


@pytest.fixture(autouse=True)
def no_child_left() -> Iterator[set[int]]:
    """The children seen by :func:`children_of`, SIGKILLed at teardown should a test leave one running."""
    seen: set[int] = set()
    _seen.append(seen)
    yield seen
    _seen.remove(seen)
    for pid in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


_seen: list[set[int]] = []


def start(spawn: Any, database_url: str, redis_url: str, prefix: str, processes: int, **extra: str) -> Proc:
    port = free_run(processes)
    env = {**FAST, "TASKMESH_WORKER_PROCESSES": str(processes), "HTTP_PORT": str(port), **extra}
    proc: Proc = spawn(**stores_env(database_url, redis_url, prefix, **env))
    proc.port = port
    for k in range(processes):  # every child serves its health on the ports after the primary's
        wait_until(lambda k=k: call(port + k, "GET", "/readyz")[0] == 200, proc=proc, timeout=30)
    children_of(proc.pid)
    return proc


async def statuses(pool: asyncpg.Pool, ids: list[str]) -> dict[str, int]:
    rows = await pool.fetch("SELECT status, count(*) AS n FROM tasks WHERE id = ANY($1::uuid[]) GROUP BY 1", ids)
    return {r["status"]: r["n"] for r in rows}


async def worker_pids(pool: asyncpg.Pool, state: str = "running") -> set[int]:
    return {r["pid"] for r in await pool.fetch("SELECT pid FROM workers WHERE state = $1", state)}


def children_of(pid: int) -> set[int]:
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        found |= {int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()}
    for seen in _seen:
        seen |= found
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie until our init reaps it: as good as gone.
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"


async def wait_for(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


async def test_three_processes_share_the_queues_and_drain_together_on_sigterm(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    proc = start(spawn, database_url, redis_url, prefix, 3, TASKMESH_WORKER_CONCURRENCY="2")
    children = children_of(proc.pid)
    assert len(children) == 3 - 1
    # Sessions of their own: a terminal's Ctrl-C reaches the primary alone, which passes one stop on.
    assert all(os.getsid(child) == child for child in children)
    await wait_for(lambda: _pids_are(pool, {proc.pid, *children}))  # each registered, as its own worker
    # The children are worker-only: health and metrics, no API.
    assert call(proc.port + 1, "POST", "/api/v1/tasks", {"name": "noop"})[0] == 404
    assert call(proc.port + 2, "GET", "/healthz")[0] == 200

    ids = [create(proc, {"name": "slow_first", "payload": {"seconds": 0.2}}) for _ in range(30)]
    await wait_for(lambda: _all(pool, ids, "completed"))
    rows = await pool.fetch("SELECT result->>'pid' AS pid FROM task_runs WHERE task_id = ANY($1::uuid[])", ids)
    assert {int(r["pid"]) for r in rows} == {proc.pid, *children}  # every process ran some

    # Six runs of 1.5 s in flight, two in each process: SIGTERM drains all three at once.
    held = [create(proc, {"name": "slow_first", "payload": {"seconds": 1.5}}) for _ in range(6)]
    await wait_for(lambda: _all(pool, held, "running"))
    t0 = time.monotonic()
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    took = time.monotonic() - t0
    assert await statuses(pool, held) == {"completed": 6}  # finished in the grace period, none handed back
    assert took < 1.5 + 3, f"the processes drained one after another ({took:.1f} s)"
    assert not [e for e in proc.events() if e["event"] == "shutdown_forced"]  # each heard one stop
    assert all(gone(pid) for pid in children)
    assert await worker_pids(pool) == set()  # every process deregistered
    assert await worker_pids(pool, "stopped") == {proc.pid, *children}
    events = [e for e in proc.events() if e["event"].startswith("worker_process_")]
    assert sorted((e["event"], e["index"], e["exit"]) for e in events if e["event"] == "worker_process_stopped") == [
        ("worker_process_stopped", 1, "exit code 0"),
        ("worker_process_stopped", 2, "exit code 0"),
    ]


async def _pids_are(pool: asyncpg.Pool, pids: set[int]) -> bool:
    return await worker_pids(pool) == pids


async def _all(pool: asyncpg.Pool, ids: list[str], status: str) -> bool:
    return await statuses(pool, ids) == {status: len(ids)}


async def test_a_worker_process_killed_with_sigkill_is_started_again_and_its_run_reclaimed(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    proc = start(spawn, database_url, redis_url, prefix, 2)
    (child,) = children_of(proc.pid)
    ids = [create(proc, {"name": "slow_first", "payload": {"seconds": 30}}) for _ in range(2)]
    await wait_for(lambda: _all(pool, ids, "running"))
    held = await pool.fetchval(
        "SELECT task_id::text FROM task_runs WHERE task_id = ANY($1::uuid[]) AND worker_id LIKE $2", ids, f"%-{child}-%"
    )
    assert held is not None, "each process claims one of the two (concurrency 1)"
    os.kill(child, signal.SIGKILL)
    answers = []

    def restarted() -> set[int]:
        answers.append(call(proc.port, "GET", "/readyz"))
        return children_of(proc.pid) - {child}

    again = wait_until(restarted, proc=proc)
    # The primary serves on while its child restarts: listed in /readyz, which stays 200.
    assert {status for status, _ in answers} == {200}
    assert {"worker_process:1": "restarting"} in [body.get("services") for _, body in answers]
    # Its run comes back by the lease (1.5 s) and its second attempt returns at once.
    await wait_for(lambda: _status_is(pool, held, "completed"))
    assert await pool.fetchval("SELECT count(*) FROM task_runs WHERE task_id = $1", held) == 2
    wait_until(lambda: call(proc.port + 1, "GET", "/readyz")[0] == 200, proc=proc)
    (exited,) = [e for e in proc.events() if e["event"] == "worker_process_exited"]
    assert (exited["index"], exited["pid"], exited["exit"]) == (1, child, "signal SIGKILL")
    started = [e["pid"] for e in proc.events() if e["event"] == "worker_process_started"]
    assert started == [child, *again]
    assert call(proc.port, "GET", "/readyz")[0] == 200
    proc.signal(signal.SIGTERM)
    proc.signal(signal.SIGTERM)  # the second ends the grace at once: the 30 s run of the primary goes back
    assert proc.wait(30) == 0


async def _status_is(pool: asyncpg.Pool, task_id: str, status: str) -> bool:
    return bool(await pool.fetchval("SELECT status = $2 FROM tasks WHERE id = $1", task_id, status))


async def test_worker_processes_stop_and_hand_back_when_the_primary_is_killed_with_sigkill(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool
) -> None:
    proc = start(spawn, database_url, redis_url, prefix, 3, TASKMESH_SHUTDOWN_GRACE_SECONDS="0.5")
    children = children_of(proc.pid)
    ids = [create(proc, {"name": "slow_first", "payload": {"seconds": 30}}) for _ in range(3)]
    await wait_for(lambda: _all(pool, ids, "running"))
    proc.signal(signal.SIGKILL)
    wait_until(lambda: all(gone(pid) for pid in children), timeout=15)
    orphaned = [e for e in proc.events() if e["event"] == "worker_process_orphaned"]
    assert len(orphaned) == 2 and {e["parent"] for e in orphaned} == {str(proc.pid)}
    handed_back = [e for e in proc.events() if e["event"] == "runs_handed_back"]
    assert [e["count"] for e in handed_back] == [1, 1]  # each child drained its run, one stop request each
    assert not [e for e in proc.events() if e["event"] == "shutdown_forced"]
    # The children deregistered; only the primary's row, killed, is left for the reclaimer.
    assert await worker_pids(pool) == {proc.pid}
    assert await worker_pids(pool, "stopped") == children


async def test_a_worker_process_that_cannot_start_stops_the_instance_past_its_restart_budget(
    spawn: Any, database_url: str, redis_url: str, prefix: str
) -> None:
    port = free_run(2)
    with socket.socket() as squatter:  # the child's port (the primary's + 1) is taken
        squatter.bind(("127.0.0.1", port + 1))
        squatter.listen()
        env = {**FAST, "TASKMESH_WORKER_PROCESSES": "2", "HTTP_PORT": str(port)}
        proc: Proc = spawn(**stores_env(database_url, redis_url, prefix, TASKMESH_SERVICE_RESTARTS="1", **env))
        assert proc.wait(60) == 1
    exits = [e["exit"] for e in proc.events() if e["event"] == "worker_process_exited"]
    assert exits == ["exit code 2", "exit code 2"]
    (failed,) = [e for e in proc.events() if e["event"] == "service_failed"]
    assert (failed["service"], failed["critical"]) == ("worker_process:1", True)
    assert f"127.0.0.1:{port + 1}" in proc.output()  # the child said which port it could not bind


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TASKMESH_WORKER_PROCESSES": "0"}, "worker_processes: must be auto or a number from 1 to 256, not '0'"),
        ({"TASKMESH_WORKER_PROCESSES": "many"}, "worker_processes: must be auto or a number from 1 to 256, not 'many'"),
        (
            {"TASKMESH_WORKER_PROCESSES": "2", "TASKMESH_WORKERS_ENABLED": "false"},
            "worker_processes: more than one process needs workers_enabled (an API-only instance runs no workers)",
        ),
        (
            {"TASKMESH_WORKER_PROCESSES": "3", "TASKMESH_HTTP_PORT": "65534"},
            "worker_processes: 3 processes need http_port 65534 to 65536 (one port up for each worker process),"
            " past 65535",
        ),
        (
            {"TASKMESH_WORKER_PROCESSES": "2", "TASKMESH_HTTP_PORT": "8080", "TASKMESH_METRICS_PORT": "65535"},
            "worker_processes: 2 processes need metrics_port 65535 to 65536 (one port up for each worker process),"
            " past 65535",
        ),
    ],
)
async def test_a_bad_worker_processes_is_refused_at_start_naming_the_key(
    spawn: Any, database_url: str, redis_url: str, prefix: str, env: dict[str, str], message: str
) -> None:
    proc: Proc = spawn(**stores_env(database_url, redis_url, prefix, **env))
    assert proc.wait(30) == 2
    assert message in proc.output()


async def test_the_dev_profile_runs_one_process_and_says_worker_processes_is_ignored(spawn: Any, tmp_path: Any) -> None:
    proc: Proc = spawn("dev", TASKMESH_DEV_DIR=str(tmp_path / "devdata"), TASKMESH_WORKER_PROCESSES="2")
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=90, proc=proc)
    [ignored] = [e for e in proc.events() if e["event"] == "worker_processes_ignored"]
    assert (ignored["worker_processes"], ignored["reason"]) == (2, "taskmesh dev runs one")
    assert not [e for e in proc.events() if e["event"] == "worker_process_started"]
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
