"""``python -m taskmesh dev`` starts its embedded Valkey and PostgreSQL again when one is killed with SIGKILL.

A real dev process, real embedded servers: the test kills a server's process
itself (as the OOM killer would), then waits for the restart line, a 200 from
``/readyz`` and a task created afterwards to complete. SIGTERM afterwards
still leaves no server behind. The last test runs the servers in this process
as a subreaper, so that a killed one stays a zombie, as under a container's
PID 1 that reaps nothing (this machine's PID 1 reaps within a second or two);
another kills PostgreSQL while a backend is busy with a query, which keeps the
old shared memory in use for a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from taskmesh.dev.stack import EmbeddedPostgres, EmbeddedValkey, ServerWatcher
from taskmesh.errors import EmbeddedServerError
from tests.proc import Proc, call, running, spawn, stop, wait_until

__all__ = ["spawn"]  # a fixture, used by name

pytestmark = pytest.mark.slow


def pid_in(pidfile: Path) -> int:
    return int(pidfile.read_text().split("\n", 1)[0].strip())


def event(proc: Proc, name: str, **keys: Any) -> dict[str, Any] | None:
    """The first log line of event ``name`` whose ``keys`` have the values given."""
    return next(
        (e for e in proc.events() if e.get("event") == name and all(e.get(k) == v for k, v in keys.items())), None
    )


def create(proc: Proc, **body: Any) -> str | None:
    """POST a task; its id, or None unless the answer is 201."""
    status, created = call(proc.port, "POST", "/api/v1/tasks", {"name": "anything", "priority": 2, **body})
    return str(created["task_id"]) if status == 201 else None


def status_of(proc: Proc, task_id: str) -> str | None:
    """The task's status, or None unless the answer is 200."""
    code, body = call(proc.port, "GET", f"/api/v1/tasks/{task_id}")
    return str(body["task"]["status"]) if code == 200 else None


def a_new_task_completes(proc: Proc) -> str:
    """Create a task and wait until it completed; returns its id.

    Right after a restart a request may still meet a connection to the old
    server and get a 503, which a client retries: so do these polls.
    """
    tid: str = wait_until(lambda: create(proc), timeout=15, proc=proc)
    wait_until(lambda: status_of(proc, tid) == "completed", timeout=30, proc=proc)
    return tid


def kill_and_wait_for_restart(proc: Proc, pidfile: Path, restarted: str) -> tuple[int, int, dict[str, Any]]:
    """SIGKILL the server named by ``pidfile``, wait for its restart and /readyz; returns (old pid, new pid, line)."""
    old = pid_in(pidfile)
    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)
    line = wait_until(lambda: event(proc, restarted), timeout=15, proc=proc)
    logged = time.monotonic() - t0
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=30, proc=proc)
    print(f"{restarted}: logged {logged:.2f} s after SIGKILL, /readyz 200 after {time.monotonic() - t0:.2f} s")
    new = pid_in(pidfile)
    log = proc.output()[-3000:]
    assert new != old and running(new) and not running(old), (old, new, log)
    # Where nothing reaps the dead server, its exit status is still in /proc; elsewhere it is gone.
    assert line["reason"] in ("killed by SIGKILL", "unknown (process gone)"), log
    assert line["pid"] == new and line["restarts"] == 1, log
    return old, new, line


def test_dev_restarts_a_killed_valkey_and_postgres_and_sigterm_still_leaves_none_behind(
    spawn: Any, tmp_path: Path
) -> None:
    dev_dir = tmp_path / "devdata"
    # A one-second sweep, so the delayed task below is re-pushed soon if the restarted Valkey lacks it.
    proc = spawn("dev", TASKMESH_DEV_DIR=str(dev_dir), TASKMESH_RECONCILE_INTERVAL_SECONDS="1")
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=90, proc=proc)
    a_new_task_completes(proc)
    valkey_port = event(proc, "embedded_valkey_started")["port"]  # type: ignore[index]  # logged at start

    # A delayed task lives only in Valkey's memory until it is due: the kill loses it (no save since).
    delayed = create(proc, delay_seconds=2)
    assert delayed is not None
    _, valkey_pid, line = kill_and_wait_for_restart(
        proc, dev_dir / "valkey" / "valkey.pid", "embedded_valkey_restarted"
    )
    assert line["port"] == valkey_port, line  # same port: the instance's Redis URL still points at it
    # The reconciler found its marker gone with the data and resynced the queue; the delayed task
    # is pushed again by that resync or, when it comes first, by the one-second sweep (seen once in
    # CI: the resync then had nothing left to push), and runs.
    wait_until(lambda: event(proc, "redis_resynced", reason="data lost"), timeout=15, proc=proc)
    a_new_task_completes(proc)
    wait_until(lambda: status_of(proc, delayed) == "completed", timeout=30, proc=proc)

    _, postmaster, line = kill_and_wait_for_restart(
        proc, dev_dir / "pg" / "postmaster.pid", "embedded_postgres_restarted"
    )
    assert line["pgdata"] == str(dev_dir / "pg"), line
    a_new_task_completes(proc)

    code, took, out = stop(proc, 15)
    assert code == 0, out
    assert took < 10, out
    assert not running(valkey_pid) and not running(postmaster), out
    leftovers = [
        pid
        for pid in subprocess.run(["pgrep", "-f", str(dev_dir)], capture_output=True, text=True).stdout.split()
        if running(int(pid))
    ]
    assert leftovers == [], out
    assert event(proc, "embedded_server_gave_up") is None, out


def test_dev_gives_up_on_a_valkey_killed_six_times_in_a_minute_answers_503_and_still_stops_promptly(
    spawn: Any, tmp_path: Path
) -> None:
    dev_dir = tmp_path / "devdata"
    pidfile = dev_dir / "valkey" / "valkey.pid"
    proc = spawn("dev", TASKMESH_DEV_DIR=str(dev_dir))
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=90, proc=proc)
    for restarts in range(1, 6):
        os.kill(pid_in(pidfile), signal.SIGKILL)
        wait_until(partial(event, proc, "embedded_valkey_restarted", restarts=restarts), timeout=15, proc=proc)
    last = pid_in(pidfile)
    os.kill(last, signal.SIGKILL)
    line = wait_until(lambda: event(proc, "embedded_server_gave_up"), timeout=15, proc=proc)
    assert line["server"] == "valkey" and line["restarts"] == 5 and line["level"] == "error", line
    time.sleep(1.5)  # three more checks: nothing starts it again
    log = proc.output()[-3000:]
    assert event(proc, "embedded_valkey_restarted", restarts=6) is None and not running(last), log
    assert call(proc.port, "GET", "/readyz")[0] == 503, log
    assert event(proc, "embedded_postgres_restarted") is None, log  # the other server was never touched
    code, took, out = stop(proc, 20)
    assert code == 0, out
    assert took < 10, out


PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Make this process the reaper of its orphaned descendants for the test, reaping none of them until the end."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the dead servers and the backends they orphaned
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.05)


def restarted(server: EmbeddedPostgres | EmbeddedValkey) -> bool:
    """One try of ``restart_dead``: ``False`` while the dead server's processes still run."""
    try:
        server.restart_dead()
    except EmbeddedServerError as exc:
        if "still run" not in str(exc):
            raise
        return False
    return True


def test_servers_killed_where_nothing_reaps_them_restart_in_place_and_stop_without_waiting(
    subreaper: None, tmp_path: Path
) -> None:
    pg = EmbeddedPostgres(tmp_path)
    valkey = EmbeddedValkey(tmp_path)
    servers: list[EmbeddedPostgres | EmbeddedValkey] = [valkey, pg]
    try:
        for server in servers:
            dead = server.process.pid
            os.kill(dead, signal.SIGKILL)
            assert wait_until(server.exit_reason, timeout=10) == "killed by SIGKILL"  # a zombie still tells
            # Over the lock files that still name the zombie's pid. PostgreSQL's other processes
            # notice their postmaster's death a moment later; until then restart_dead refuses
            # (and the dev watcher tries again, as here).
            wait_until(partial(restarted, server), timeout=10)
            assert server.exit_reason() is None and server.process.pid != dead
        assert valkey._server.client().ping()
        for server in servers:
            os.kill(server.process.pid, signal.SIGKILL)
            wait_until(server.exit_reason, timeout=10)
            t0 = time.monotonic()
            server.stop()
            assert time.monotonic() - t0 < 2, server.name  # no wait for a zombie to go away
        assert not (pg.pgdata / "postmaster.pid").exists()
        assert not (tmp_path / "valkey" / "valkey.pid").exists()
    finally:
        valkey.stop()
        pg.stop()


def busy_backend(url: str, seconds: float, started: threading.Event) -> None:
    """Keep one backend busy for ``seconds`` in a loop that never looks for its postmaster."""

    async def run() -> None:
        conn = await asyncpg.connect(url)
        started.set()
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            await conn.execute(
                "DO $$ DECLARE t timestamptz := clock_timestamp(); BEGIN "
                f"WHILE clock_timestamp() < t + interval '{seconds} s' LOOP END LOOP; END $$"
            )
        conn.terminate()

    asyncio.run(run())


def test_postgres_killed_during_a_long_query_is_restarted_once_its_old_backend_has_exited(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path)
    watcher = ServerWatcher([pg])
    started = threading.Event()
    busy = threading.Thread(target=busy_backend, args=(pg.url, 3.0, started), daemon=True)
    try:
        busy.start()
        assert started.wait(10)
        time.sleep(0.3)  # the DO block is running
        t0 = time.monotonic()
        os.kill(pg.process.pid, signal.SIGKILL)
        with capture_logs() as logs:
            while time.monotonic() - t0 < 30 and not any(e["event"] == "embedded_postgres_restarted" for e in logs):
                watcher.run_once()
                time.sleep(0.5)
        events = [e["event"] for e in logs]
        assert "embedded_postgres_restarted" in events and "embedded_server_gave_up" not in events, logs
        failed = [e for e in logs if e["event"] == "embedded_server_restart_failed"]
        # The backend outlived its postmaster by seconds: no start was tried over it, and the watcher waited.
        assert failed and all("of the dead server still run" in e["error"] for e in failed), failed
        print(f"postgres restarted {time.monotonic() - t0:.1f} s after SIGKILL, after {len(failed)} refused starts")

        async def select_one() -> int:
            conn = await asyncpg.connect(pg.url)
            try:
                return int(await conn.fetchval("SELECT 1"))
            finally:
                await conn.close()

        assert asyncio.run(select_one()) == 1
    finally:
        busy.join(10)
        pg.stop()
