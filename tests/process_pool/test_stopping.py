"""Stopping handler processes: timeouts, cancellation, crashes, the parent's death, closing the pool.

The guarantee under test: when ``run()`` returns or raises, the handler's
process no longer exists (its pid, written by the handler, is gone).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from taskmesh.runtime.process_pool import ChildOutcome, PoolClosedError, ProcessPool
from tests.process_pool import handlers
from tests.process_pool.support import (
    ROOT,
    both_loops,
    captured_logs,
    pid_from,
    pid_from_sync,
    pid_running,
    ref,
    wait_gone,
)

pytestmark = pytest.mark.anyio


@both_loops
async def test_a_timeout_stops_a_sleeping_handler_before_run_returns(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    async with ProcessPool(1, stop_grace_seconds=1.0) as pool:
        outcome = await pool.run(ref(handlers.write_pid_and_sleep), {"pid_file": str(pid_file)}, None, timeout=0.3)
        assert (outcome.kind, outcome.error, outcome.retryable) == ("timed_out", "timed out after 0.3 s", True)
        assert not pid_running(int(pid_file.read_text()))
        assert outcome.duration_seconds >= 0.3
        assert (pool.alive, pool.busy) == (0, 0)


async def test_a_handler_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    async with ProcessPool(1, stop_grace_seconds=0.3) as pool:
        with captured_logs() as logs:
            payload = {"pid_file": str(pid_file)}
            outcome = await pool.run(ref(handlers.ignore_sigterm_and_sleep), payload, None, timeout=0.3)
        assert (outcome.kind, outcome.error) == ("timed_out", "timed out after 0.3 s")
        pid = int(pid_file.read_text())
        assert not pid_running(pid)
    stopped = [e for e in logs if e["event"] == "handler_process_stopped"]
    assert stopped == [
        {
            "event": "handler_process_stopped",
            "log_level": "warning",
            "pid": pid,
            "reason": "timed_out",
            "signal": "SIGKILL",
            "exit": "signal SIGKILL",
        }
    ]


@both_loops
@pytest.mark.parametrize("handler", [handlers.write_pid_and_sleep, handlers.ignore_sigterm_and_sleep])
async def test_cancelling_the_caller_stops_the_handler_before_the_cancellation_propagates(
    tmp_path: Path, handler: Callable[..., Any]
) -> None:
    pid_file = tmp_path / "pid"
    pids: list[int] = []

    async def cancel_once_running(scope: anyio.CancelScope) -> None:
        pids.append(await pid_from(pid_file))
        scope.cancel()

    async with ProcessPool(1, stop_grace_seconds=0.3) as pool, anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:
            tg.start_soon(cancel_once_running, scope)
            await pool.run(ref(handler), {"pid_file": str(pid_file)}, None)
            pytest.fail("run() returned instead of being cancelled")
        assert scope.cancelled_caught
        # Checked right where the cancellation arrives, before anything else could reap the child.
        assert not pid_running(pids[0])
        assert (pool.alive, pool.busy) == (0, 0)


async def test_an_idle_child_whose_last_handler_ignored_sigterm_still_stops_at_sigterm(tmp_path: Path) -> None:
    pool = ProcessPool(1, stop_grace_seconds=5.0)
    payload = {"pid_file": str(tmp_path / "pid"), "seconds": 0}
    assert (await pool.run(ref(handlers.ignore_sigterm_and_sleep), payload, None)).kind == "returned"
    with captured_logs() as logs:
        await pool.aclose()
    assert [(e["event"], e["signal"], e["exit"]) for e in logs] == [
        ("handler_process_stopped", "SIGTERM", "signal SIGTERM")
    ]


async def test_a_sigint_to_the_process_group_does_not_reach_the_handler(tmp_path: Path) -> None:
    # A Ctrl-C in a terminal goes to every process of the group; the instance decides what to stop.
    pid_file = tmp_path / "pid"
    async with ProcessPool(1) as pool, anyio.create_task_group() as tg:
        outcomes: list[ChildOutcome] = []

        async def call() -> None:
            payload = {"pid_file": str(pid_file), "seconds": 0.3}
            outcomes.append(await pool.run(ref(handlers.write_pid_and_sleep), payload, None))

        tg.start_soon(call)
        os.kill(await pid_from(pid_file), signal.SIGINT)
    assert [o.kind for o in outcomes] == ["returned"], outcomes


@both_loops
async def test_a_child_that_exits_gives_died_with_its_exit_code_and_the_next_run_starts_a_new_one() -> None:
    async with ProcessPool(1) as pool:
        outcome = await pool.run(ref(handlers.exit_3), None, None)
        assert (outcome.kind, outcome.error, outcome.retryable) == ("died", "handler process died (exit code 3)", True)
        assert pool.alive == 0
        again = await pool.run(ref(handlers.whoami), None, None)
        assert again.kind == "returned" and pool.alive == 1


async def test_a_segfault_gives_died_with_sigsegv() -> None:
    async with ProcessPool(1) as pool:
        outcome = await pool.run(ref(handlers.segfault), None, None)
    assert (outcome.kind, outcome.error) == ("died", "handler process died (signal SIGSEGV)")


async def test_a_child_killed_while_idle_is_replaced_without_failing_a_run() -> None:
    async with ProcessPool(1) as pool:
        first = await pool.run(ref(handlers.whoami), None, None)
        assert first.result_json is not None
        pid = int(first.result_json)
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(5):
            while pid_running(pid):
                await anyio.sleep(0.01)
        second = await pool.run(ref(handlers.whoami), None, None)
        assert second.kind == "returned" and second.result_json is not None
        assert int(second.result_json) != pid
        assert pool.alive == 1


def test_a_child_does_not_outlive_a_parent_killed_with_sigkill(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    parent = subprocess.Popen(
        [sys.executable, "-m", "tests.process_pool.pool_parent", "sleep", str(pid_file)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        pid = pid_from_sync(pid_file)
        assert pid_running(pid)
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(parent.pid)  # its child
        parent.kill()
        parent.wait(5)
        assert wait_gone(pid, 2.0), f"handler process {pid} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if pid_file.exists() and pid_running(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_parent_exiting_without_aclose_leaves_no_child_even_one_ignoring_sigterm(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    # multiprocessing's exit hook would SIGTERM the idle child, then wait for it forever.
    done = subprocess.run(
        [sys.executable, "-m", "tests.process_pool.pool_parent", "exit", str(pid_file)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=20,
    )
    pid = int(pid_file.read_text())
    try:
        assert done.returncode == 0
        assert wait_gone(pid, 2.0), f"handler process {pid} outlived its parent"
    finally:
        if pid_running(pid):
            os.kill(pid, signal.SIGKILL)


async def test_aclose_stops_every_child_and_can_be_called_twice() -> None:
    pool = ProcessPool(2)
    pids: set[int] = set()

    async def whoami() -> None:
        outcome = await pool.run(ref(handlers.whoami), None, None)
        assert outcome.result_json is not None
        pids.add(int(outcome.result_json))

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(whoami)
    assert pool.alive == 2 and len(pids) == 2
    await pool.aclose()
    assert pool.alive == 0
    assert not any(pid_running(pid) for pid in pids)
    await pool.aclose()
    with pytest.raises(PoolClosedError):
        await pool.run(ref(handlers.echo), None, None)


async def test_aclose_ends_a_call_in_progress_and_a_waiting_one(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    pool = ProcessPool(1, stop_grace_seconds=0.5)
    results: dict[str, object] = {}

    async def call(name: str) -> None:
        try:
            results[name] = await pool.run(ref(handlers.write_pid_and_sleep), {"pid_file": str(pid_file)}, None)
        except PoolClosedError as exc:
            results[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "running")
        pid = await pid_from(pid_file)
        tg.start_soon(call, "waiting")
        await anyio.sleep(0.05)
        await pool.aclose()
    running = results["running"]
    assert getattr(running, "kind", None) == "died"
    assert getattr(running, "error", None) == "handler process stopped: the pool was closed"
    assert isinstance(results["waiting"], PoolClosedError)
    assert not pid_running(pid) and pool.alive == 0
