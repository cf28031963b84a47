"""SIGTERM and SIGINT are heard while the loop is blocked: real processes, real signals, both loops.

Each test runs ``program.py`` (an anyio program shaped like an instance) under
asyncio and under uvloop. Its emergency writes a marker file and exits with
status 3, so a test can tell the emergency exit from a graceful one (0).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.loop_monitor.harness import BACKENDS, ROOT, Program

each_loop = pytest.mark.parametrize("backend", BACKENDS)
asyncio_only = pytest.mark.parametrize("backend", ["asyncio"])  # the same code path on both: one is enough

Start = Callable[..., Program]


@each_loop
def test_sigterm_to_a_loop_blocked_in_time_sleep_ends_it_through_the_emergency_after_grace_and_margin(
    start: Start, backend: str
) -> None:
    grace, margin = 2.0, 1.0
    p = start("--backend", backend, "--block", "sleep", "--grace", str(grace), "--margin", str(margin))
    p.wait_for("event_loop_blocked")
    sent = p.signal(signal.SIGTERM)
    # Logged by the watchdog thread while the loop is still blocked.
    assert p.wait_for("shutdown_requested", timeout=1)["signal"] == "SIGTERM"
    assert p.wait(timeout=grace + margin + 2) == 3
    took = time.monotonic() - sent
    assert grace + margin - 0.2 <= took <= grace + margin + 2, took
    assert p.marker.read_text() == "emergency\n"
    assert [e["reason"] for e in p.events("shutdown_emergency")] == ["deadline"]
    assert not p.events("shutdown_forced")  # heard through both channels, counted once
    assert not p.events("program_draining")  # on_first was queued on the loop, which never turned


@each_loop
def test_a_second_sigterm_to_a_blocked_loop_calls_the_emergency_at_once(start: Start, backend: str) -> None:
    p = start("--backend", backend, "--block", "sleep", "--grace", "30")
    p.wait_for("event_loop_blocked")
    p.signal(signal.SIGTERM)
    p.wait_for("shutdown_requested", timeout=1)
    time.sleep(0.5)
    sent = p.signal(signal.SIGTERM)
    assert p.wait(timeout=2) == 3
    assert time.monotonic() - sent < 1.0
    assert p.marker.exists()
    assert p.wait_for("shutdown_forced")["signal"] == "SIGTERM"
    assert [e["reason"] for e in p.events("shutdown_emergency")] == ["second_signal"]


@each_loop
def test_sigterm_is_heard_while_the_loop_waits_inside_c_code_that_never_returns_to_python(
    start: Start, backend: str
) -> None:
    # The Python-level handler cannot run here; the wakeup fd written by CPython's C handler still tells.
    p = start("--backend", backend, "--block", "mutex", "--grace", "0.5", "--margin", "0.5")
    p.wait_for("event_loop_blocked")
    sent = p.signal(signal.SIGTERM)
    requested = p.wait_for("shutdown_requested", timeout=1)
    assert requested["signal"] == "SIGTERM"
    assert p.wait(timeout=3) == 3
    assert time.monotonic() - sent < 3
    assert p.marker.exists()


@asyncio_only
def test_sigterm_is_heard_by_the_python_handler_when_other_code_takes_the_wakeup_fd_over(
    start: Start, backend: str
) -> None:
    p = start("--backend", backend, "--block", "sleep", "--take-wakeup-fd", "--grace", "0.3", "--margin", "0.3")
    p.wait_for("event_loop_blocked")
    p.signal(signal.SIGTERM)
    assert p.wait_for("shutdown_requested", timeout=1)["signal"] == "SIGTERM"
    assert p.wait(timeout=3) == 3
    assert [e["reason"] for e in p.events("shutdown_emergency")] == ["deadline"]
    assert not p.events("shutdown_forced")


@each_loop
def test_sigterm_to_a_live_loop_stops_it_gracefully_even_past_grace_and_margin(start: Start, backend: str) -> None:
    # The drain lasts 1 s, past grace + margin (0.6 s), but the loop turns: no emergency.
    p = start("--backend", backend, "--grace", "0.3", "--margin", "0.3", "--drain", "1")
    p.wait_for("program_ready")
    sent = p.signal(signal.SIGTERM)
    p.wait_for("program_draining", timeout=1)
    assert time.monotonic() - sent < 0.5  # on_first ran on the loop promptly
    assert p.wait(timeout=5) == 0
    assert p.events("program_stopped") == [p.events("program_stopped")[0]]
    assert p.events("program_stopped")[0]["forced"] is False
    assert not p.marker.exists()
    assert not p.events("shutdown_emergency")


@each_loop
def test_sigint_then_sigterm_to_a_live_loop_runs_on_second(start: Start, backend: str) -> None:
    p = start("--backend", backend, "--drain", "20")
    p.wait_for("program_ready")
    p.signal(signal.SIGINT)
    assert p.wait_for("shutdown_requested")["signal"] == "SIGINT"
    p.wait_for("program_draining", timeout=1)
    sent = p.signal(signal.SIGTERM)
    assert p.wait(timeout=2) == 0
    assert time.monotonic() - sent < 1.0  # not the 20 s drain: on_second ended it
    assert p.events("program_stopped")[0]["forced"] is True
    assert p.wait_for("shutdown_forced")["signal"] == "SIGTERM"
    assert not p.marker.exists()


@asyncio_only
def test_the_backstop_ends_a_shutdown_that_never_finishes_though_the_loop_turns(start: Start, backend: str) -> None:
    p = start(
        "--backend", backend, "--grace", "0.3", "--margin", "0.3", "--backstop", "1", "--drain", "60",
        "--emergency", "default",
    )  # fmt: skip
    p.wait_for("program_ready")
    sent = p.signal(signal.SIGTERM)
    assert p.wait(timeout=3) == 1
    assert 1.2 <= time.monotonic() - sent < 2.5
    assert [e["reason"] for e in p.events("shutdown_emergency")] == ["backstop"]
    assert p.wait_for("shutdown_emergency_exit")["exit_code"] == 1


@asyncio_only
def test_an_emergency_that_raises_still_ends_the_process(start: Start, backend: str) -> None:
    p = start("--backend", backend, "--block", "sleep", "--emergency", "failing")
    p.wait_for("event_loop_blocked")
    p.signal(signal.SIGTERM)
    p.wait_for("shutdown_requested", timeout=1)
    p.signal(signal.SIGTERM)
    assert p.wait(timeout=2) == 1
    assert p.wait_for("shutdown_emergency_failed")["error"] == "RuntimeError: cannot reach PostgreSQL"


@each_loop
def test_other_python_signal_handlers_still_run_promptly_on_an_idle_loop(start: Start, backend: str) -> None:
    # No ticker: nothing wakes an idle uvloop but the wakeup fd we took over and forward to it.
    p = start("--backend", backend, "--no-monitor", "--drain", "0")
    p.wait_for("program_ready")
    time.sleep(0.2)
    p.signal(signal.SIGUSR1)
    p.wait_for("usr1_handled", timeout=0.5)
    p.signal(signal.SIGTERM)
    assert p.wait(timeout=3) == 0


@each_loop
def test_leaving_the_context_puts_back_the_handlers_and_wakeup_fd_it_found(backend: str) -> None:
    script = Path(__file__).with_name("restore_program.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(script), backend], capture_output=True, env=env, timeout=10)
    assert done.returncode == 0, done.stderr.decode()
    events = [json.loads(line) for line in done.stderr.decode().splitlines() if line.startswith("{")]
    assert [e["event"] for e in events] == [
        "shutdown_requested",
        "instance_done",
        "shutdown_requested",
        "instance_done",
        "terminated_early",
    ]
    assert all(e["handlers_back"] and e["wakeup_fd_back"] for e in events if e["event"] == "instance_done")
