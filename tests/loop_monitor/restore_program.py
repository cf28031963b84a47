"""Two instances one after the other in one process, then the CLI's early SIGTERM handler again.

``python tests/loop_monitor/restore_program.py asyncio|uvloop``: installs
``exits.terminate_early`` as the CLI does, runs two anyio programs in turn, each
with a :class:`~taskmesh.runtime.shutdown_signals.ShutdownSignals` that gets a real
SIGTERM (sent to itself), and logs ``instance_done`` (``n``, ``handlers_back``,
``wakeup_fd_back``) after each; then sends SIGTERM once more and logs
``terminated_early`` when ``exits.Terminated`` is raised, as before the first.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import anyio
import structlog

from taskmesh.cli.exits import Terminated, terminate_early
from taskmesh.observability.logs import configure
from taskmesh.runtime.loop_monitor import LoopMonitor
from taskmesh.runtime.shutdown_signals import ShutdownSignals

log = structlog.get_logger("restore_program")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def wakeup_fd() -> int:
    """The current wakeup fd, left as it was (the only way to read it is to set it)."""
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
    return fd


async def instance(n: int) -> None:
    handlers, fd = [signal.getsignal(s) for s in SIGNALS], wakeup_fd()
    stop = anyio.Event()
    monitor = LoopMonitor(0.5, worker_id=f"w{n}")
    with ShutdownSignals(on_first=stop.set, on_second=stop.set, grace_seconds=1, monitor=monitor):
        assert signal.getsignal(signal.SIGTERM) is not handlers[0]
        os.kill(os.getpid(), signal.SIGTERM)
        with anyio.fail_after(2):
            await stop.wait()
    log.info(
        "instance_done",
        n=n,
        handlers_back=[signal.getsignal(s) for s in SIGNALS] == handlers,
        wakeup_fd_back=wakeup_fd() == fd,
    )


def main(backend: str) -> None:
    configure("info", "json")
    signal.signal(signal.SIGTERM, terminate_early)
    for n in (1, 2):
        anyio.run(instance, n, backend_options={"use_uvloop": backend == "uvloop"})
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)
    except Terminated:
        log.info("terminated_early")


if __name__ == "__main__":
    main(sys.argv[1])
