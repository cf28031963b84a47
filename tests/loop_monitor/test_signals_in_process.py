"""ShutdownSignals inside the test process: its entry rules and request_stop (no real signal here)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import anyio
import pytest

from taskmesh.runtime.loop_monitor import LoopMonitor
from taskmesh.runtime.shutdown_signals import ShutdownSignals

pytestmark = pytest.mark.anyio


def _noop() -> None:
    pass


def _signals(
    *,
    on_first: Callable[[], object] = _noop,
    on_second: Callable[[], object] = _noop,
    grace_seconds: float = 1.0,
    margin_seconds: float = 3.0,
    backstop_seconds: float = 30.0,
) -> ShutdownSignals:
    return ShutdownSignals(
        on_first=on_first,
        on_second=on_second,
        grace_seconds=grace_seconds,
        margin_seconds=margin_seconds,
        backstop_seconds=backstop_seconds,
        monitor=LoopMonitor(0.5, worker_id="w"),  # never run: never blocked, so never an emergency here
    )


async def test_request_stop_calls_on_first_then_on_second_on_the_loop() -> None:
    first, second = anyio.Event(), anyio.Event()
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def on_first() -> None:
        threads.append(threading.get_ident())
        first.set()

    with _signals(on_first=on_first, on_second=second.set) as sig:
        assert sig.requested_at is None
        sig.request_stop()
        with anyio.fail_after(2):
            await first.wait()
        assert threads == [loop_thread] and sig.requested_at is not None and not sig.forced
        sig.request_stop()
        with anyio.fail_after(2):
            await second.wait()
        assert sig.forced


async def test_only_one_can_be_active_and_the_first_stays_in_place() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with _signals() as outer:
        installed = signal.getsignal(signal.SIGTERM)
        with pytest.raises(RuntimeError, match="another ShutdownSignals"), _signals():
            pass
        assert signal.getsignal(signal.SIGTERM) == installed
        outer.request_stop()
    assert signal.getsignal(signal.SIGTERM) == before
    with pytest.raises(RuntimeError, match="outside"):
        outer.request_stop()


async def test_it_must_be_entered_in_the_main_thread() -> None:
    def enter() -> None:
        with _signals():
            pass

    with pytest.raises(RuntimeError, match="main thread"):
        await anyio.to_thread.run_sync(enter)


def test_it_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="no running event loop"), _signals():
        pass


@pytest.mark.parametrize(
    ("grace", "margin", "backstop"),
    [(-1.0, 3.0, 30.0), (1.0, -1.0, 30.0), (1.0, 5.0, 5.0)],
)
def test_it_refuses_negative_periods_and_a_backstop_within_the_margin(
    grace: float, margin: float, backstop: float
) -> None:
    with pytest.raises(ValueError, match="backstop > margin"):
        _signals(grace_seconds=grace, margin_seconds=margin, backstop_seconds=backstop)
