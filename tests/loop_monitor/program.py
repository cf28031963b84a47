"""An anyio program shaped like an instance, for the loop-monitor tests to run as a real process.

``python tests/loop_monitor/program.py --backend uvloop --block sleep --block-seconds 120 ...``

It runs a :class:`~taskmesh.runtime.loop_monitor.LoopMonitor` and a
:class:`~taskmesh.runtime.shutdown_signals.ShutdownSignals` the way the supervisor
does: ``on_first`` sets a stop event, ``on_second`` a force event; after the
stop, a "drain" phase waits for the force event up to ``--drain`` seconds while
the loop turns; a "run" (a coroutine awaited by a function holding
``_taskmesh_run``) may block the loop. Its emergency writes ``--marker`` and
exits with status 3 (``--emergency default``: the module's own, status 1;
``--emergency failing``: one that raises). Log lines are JSON on stderr; the program's own events
are ``program_ready``, ``program_draining``, ``program_stopped`` (``forced``)
and ``program_exit`` (``blocked_total``).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import structlog

from taskmesh.observability.logs import configure
from taskmesh.observability.metrics import Metrics
from taskmesh.runtime.loop_monitor import LoopMonitor
from taskmesh.runtime.shutdown_signals import ShutdownSignals, exit_now
from taskmesh.tasks.models import ClaimedTask

log = structlog.get_logger("program")

EMERGENCY_EXIT = 3
TASK = ClaimedTask(
    task_id=uuid.UUID("00000000-0000-4000-8000-0000000000aa"),
    run_id=uuid.uuid4(),
    name="reports.render",
    queue="default",
    priority=0,
    payload={},
    attempt=2,
    retries=1,
    max_retries=3,
    idempotency_key=None,
    trace_id="trace-1",
    tenant_id=None,
)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def block_in_c(seconds: float) -> None:
    """Wait in C with the GIL released, where signals never return to Python.

    A second lock of a (normal) mutex the thread holds; ``pthread_mutex_timedlock``
    never fails with EINTR, so the Python-level handler cannot run until it times out.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    mutex = ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER is all zeros (40 bytes) on glibc
    libc.pthread_mutex_lock(mutex)
    deadline = _Timespec(int(time.time() + seconds), 0)
    libc.pthread_mutex_timedlock(mutex, ctypes.byref(deadline))


async def handler(block: str, seconds: float) -> None:
    """A badly written async handler: blocks the loop."""
    if block == "sleep":
        time.sleep(seconds)  # BLOCKS
    elif block == "mutex":
        block_in_c(seconds)


async def execute(task: ClaimedTask, run: Callable[[], Any]) -> None:
    """What the executor does around a handler: keep the run in a local the monitor looks for."""
    _taskmesh_run = task
    await run()


async def work(opts: argparse.Namespace, sig: ShutdownSignals) -> None:
    if opts.block == "none":
        return
    await anyio.sleep(0.3)  # a few ticks first
    run = partial(handler, opts.block, opts.block_seconds)
    if opts.as_run:
        await execute(TASK, run)
    else:
        await run()
    if opts.stop_after_block:
        await anyio.sleep(0.5)  # the watcher sees the tick and logs the end of the episode
        sig.request_stop()


def emergency(marker: Path) -> None:
    marker.write_text("emergency\n")
    os._exit(EMERGENCY_EXIT)


def failing_emergency() -> None:
    raise RuntimeError("cannot reach PostgreSQL")


def on_usr1(signum: int, frame: object) -> None:
    # Another component's Python-level handler: raw write, no lock (it may run inside a logger).
    os.write(2, b'{"event": "usr1_handled"}\n')


async def main(opts: argparse.Namespace) -> None:
    metrics = Metrics()
    stop, force = anyio.Event(), anyio.Event()
    monitor = LoopMonitor(opts.threshold, worker_id="worker-test", metrics=metrics)
    signal.signal(signal.SIGUSR1, on_usr1)
    emergencies: dict[str, Callable[[], object]] = {
        "marker": partial(emergency, Path(opts.marker)),
        "default": exit_now,
        "failing": failing_emergency,
    }
    with ShutdownSignals(
        on_first=stop.set,
        on_second=force.set,
        grace_seconds=opts.grace,
        margin_seconds=opts.margin,
        backstop_seconds=opts.backstop,
        monitor=monitor,
        emergency=emergencies[opts.emergency],
    ) as sig:
        if opts.take_wakeup_fd:
            # Other code takes the wakeup fd over, as asyncio's add_signal_handler (anyio's
            # open_signal_receiver) does: only the Python-level handler still tells of SIGTERM.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, lambda: None)
        async with anyio.create_task_group() as tg:
            if opts.monitor:
                tg.start_soon(monitor.run)
            tg.start_soon(work, opts, sig)
            log.info("program_ready", pid=os.getpid())
            await stop.wait()
            log.info("program_draining")
            with anyio.move_on_after(opts.drain):
                await force.wait()
            log.info("program_stopped", forced=force.is_set())
            tg.cancel_scope.cancel()
    log.info("program_exit", blocked_total=metrics.registry.get_sample_value("taskmesh_event_loop_blocked_total"))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["asyncio", "uvloop"], default="asyncio")
    p.add_argument("--block", choices=["none", "sleep", "mutex"], default="none")
    p.add_argument("--block-seconds", type=float, default=120.0)
    p.add_argument("--as-run", action="store_true", help="block inside a function holding _taskmesh_run")
    p.add_argument("--stop-after-block", action="store_true", help="request_stop() once the block ends")
    p.add_argument("--take-wakeup-fd", action="store_true", help="asyncio only: add_signal_handler(SIGHUP)")
    p.add_argument("--no-monitor", dest="monitor", action="store_false", help="do not run the ticker")
    p.add_argument("--threshold", type=float, default=0.3)
    p.add_argument("--grace", type=float, default=2.0)
    p.add_argument("--margin", type=float, default=3.0)
    p.add_argument("--backstop", type=float, default=30.0)
    p.add_argument("--drain", type=float, default=2.0, help="longest the drain phase waits for a second signal")
    p.add_argument("--marker", default=os.devnull)
    p.add_argument(
        "--emergency",
        choices=["marker", "default", "failing"],
        default="marker",
        help="write --marker and exit 3; the module's default (exit 1); or raise",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    options = parse()
    configure("info", "json")
    anyio.run(main, options, backend_options={"use_uvloop": options.backend == "uvloop"})
