"""The loop monitor: one warning per blocking episode, naming the stack and the run that blocks."""

from __future__ import annotations

import dataclasses
import io
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from taskmesh.config import load_settings
from taskmesh.errors import ConfigError
from taskmesh.observability.metrics import Metrics
from taskmesh.runtime.loop_monitor import LoopMonitor, loop_thread_stack
from taskmesh.tasks.models import ClaimedTask
from tests.loop_monitor.harness import BACKENDS, PROGRAM, Program, line_of
from tests.loop_monitor.program import TASK

Start = Callable[..., Program]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_that_calls_time_sleep_is_named_in_one_warning_per_episode(start: Start, backend: str) -> None:
    p = start(
        "--backend",
        backend,
        "--block",
        "sleep",
        "--block-seconds",
        "3",
        "--as-run",
        "--stop-after-block",
        "--drain",
        "0",
    )
    assert p.wait(timeout=8) == 0
    blocked, unblocked = p.events("event_loop_blocked"), p.events("event_loop_unblocked")
    assert len(blocked) == 1 and len(unblocked) == 1, p.output()
    run = {
        "task_id": str(TASK.task_id),
        "task_name": "reports.render",
        "queue": "default",
        "attempt": 2,
        "trace_id": "trace-1",
        "worker_id": "worker-test",
    }
    assert blocked[0].items() >= run.items()
    assert unblocked[0].items() >= run.items()
    assert blocked[0]["stack"][0] == f"{PROGRAM}:{line_of('# BLOCKS')} handler"
    assert any(frame.endswith(" execute") for frame in blocked[0]["stack"])
    assert 0.3 <= blocked[0]["blocked_for_s"] < 0.6  # said when it crossed the threshold, not later
    assert 3.0 <= unblocked[0]["blocked_for_s"] < 3.6
    events = [e["event"] for e in p.events()]
    assert events.index("event_loop_blocked") < events.index("event_loop_unblocked")
    assert p.wait_for("program_exit")["blocked_total"] == 1.0


async def _block(seconds: float) -> None:
    time.sleep(seconds)  # an async function that blocks the loop, outside any run


def _lag(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("taskmesh_event_loop_lag_seconds")
    assert value is not None
    return value


@pytest.mark.anyio
async def test_a_block_outside_a_run_is_one_episode_counted_once_with_its_lag() -> None:
    metrics = Metrics()
    # Slower ticks than the default, so that the lag of the first tick after the block can be read.
    monitor = LoopMonitor(0.6, worker_id="w", metrics=metrics, tick_seconds=0.25)
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(monitor.run)
            await anyio.sleep(0.3)
            assert not monitor.is_blocked() and monitor.blocked_for() < 0.3
            await _block(1.0)
            await anyio.sleep(0.05)  # the overdue tick runs first, the next comes 0.25 s later
            assert _lag(metrics) >= 0.6
            await anyio.sleep(0.5)
            tg.cancel_scope.cancel()
    events = [e for e in logs if e["event"].startswith("event_loop")]
    assert [e["event"] for e in events] == ["event_loop_blocked", "event_loop_unblocked"]
    assert "task_id" not in events[0] and events[0]["stack"][0].endswith(" _block")
    assert 1.0 <= events[1]["blocked_for_s"] < 1.5
    assert metrics.registry.get_sample_value("taskmesh_event_loop_blocked_total") == 1.0
    assert _lag(metrics) < 0.2  # ticks after the block are on time again
    assert monitor.blocked_for() == 0.0 and not monitor.is_blocked()  # not running: never blocked


def _hold(
    outer: ClaimedTask | None, inner: ClaimedTask | None, ready: threading.Event, release: threading.Event
) -> None:
    _taskmesh_run = outer
    _middle(inner, ready, release)


def _middle(inner: ClaimedTask | None, ready: threading.Event, release: threading.Event) -> None:
    _taskmesh_run = inner

    def held() -> ClaimedTask | None:  # a closure makes the run a cell variable, not a plain local
        return _taskmesh_run

    assert held() is inner
    _innermost(ready, release)


def _innermost(ready: threading.Event, release: threading.Event) -> None:
    _taskmesh_run = None  # not a ClaimedTask: the walk goes on outwards
    ready.set()
    release.wait(5)


def _other_thread_stack(outer: ClaimedTask | None, inner: ClaimedTask | None) -> tuple[list[str], dict[str, Any]]:
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_hold, args=(outer, inner, ready, release))
    thread.start()
    try:
        assert ready.wait(5)
        assert thread.ident is not None
        return loop_thread_stack(thread.ident, "w-1", depth=5)
    finally:
        release.set()
        thread.join()


def test_the_stack_walk_names_the_top_frames_and_the_innermost_run() -> None:
    inner = dataclasses.replace(TASK, task_id=uuid.uuid4())
    stack, run = _other_thread_stack(TASK, inner)
    assert len(stack) == 5
    assert stack[0].startswith(f"{threading.__file__}:") and stack[0].endswith(" wait")
    assert [frame.rsplit(" ", 1)[1] for frame in stack[2:]] == ["_innermost", "_middle", "_hold"]
    assert stack[2].startswith(f"{Path(__file__)}:")
    assert run["task_id"] == str(inner.task_id) and run["worker_id"] == "w-1"


def test_the_stack_walk_gives_no_run_keys_where_no_frame_holds_a_run() -> None:
    stack, run = _other_thread_stack(None, None)
    assert stack and run == {}
    assert loop_thread_stack(-1, "w") == ([], {})  # a thread that is gone


def test_the_monitor_refuses_a_threshold_within_two_ticks() -> None:
    with pytest.raises(ValueError, match="above two ticks"):
        LoopMonitor(0.2, worker_id="w")


def test_the_threshold_setting_defaults_to_one_second_and_refuses_less_than_a_quarter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TASKMESH_CONFIG", raising=False)
    monkeypatch.delenv("TASKMESH_LOOP_BLOCK_THRESHOLD_SECONDS", raising=False)
    assert load_settings().loop_block_threshold_seconds == 1.0
    monkeypatch.setenv("TASKMESH_LOOP_BLOCK_THRESHOLD_SECONDS", "0.1")
    with pytest.raises(ConfigError, match="loop_block_threshold_seconds"):
        load_settings()


@pytest.mark.anyio
async def test_a_console_renderer_prints_the_blocked_line_with_its_stack_as_text() -> None:
    """structlog's console renderer (a terminal, or structlog unconfigured) wants ``stack`` as text: the
    monitor's thread must neither die on it nor lose the line."""
    before = structlog.get_config()
    out = io.StringIO()
    structlog.configure(
        processors=[structlog.dev.ConsoleRenderer(colors=False)], logger_factory=structlog.PrintLoggerFactory(out)
    )
    try:
        monitor = LoopMonitor(0.6, worker_id="w", tick_seconds=0.25)
        async with anyio.create_task_group() as tg:
            tg.start_soon(monitor.run)
            await anyio.sleep(0.3)
            await _block(1.0)
            await anyio.sleep(0.5)
            tg.cancel_scope.cancel()
    finally:
        structlog.configure(**before)
    printed = out.getvalue()
    assert "event_loop_blocked" in printed and " _block" in printed, printed
