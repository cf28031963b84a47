"""A parent process for the tests of what happens to children when their parent goes.

Usage: ``python -m tests.process_pool.pool_parent MODE PID_FILE``; the handler
writes its pid to PID_FILE, then sleeps a minute.

- ``sleep``: the test SIGKILLs this process while the handler sleeps.
- ``exit``: the pool runs on an event loop in a daemon thread, the handler
  ignores SIGTERM, and the main thread returns: the interpreter exits with the
  call in progress and the pool never closed.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import anyio

from taskmesh.runtime.process_pool import ProcessPool
from tests.process_pool import handlers
from tests.process_pool.support import ref


async def call(mode: str, pid_file: str) -> None:
    pool = ProcessPool(1, log_level="warning")
    handler = handlers.write_pid_and_sleep if mode == "sleep" else handlers.ignore_sigterm_and_sleep
    await pool.run(ref(handler), {"pid_file": pid_file, "seconds": 60}, None)


def main(mode: str, pid_file: str) -> None:
    if mode == "sleep":
        anyio.run(call, mode, pid_file)
        return
    threading.Thread(target=anyio.run, args=(call, mode, pid_file), daemon=True).start()
    deadline = time.monotonic() + 20
    while not Path(pid_file).exists() and time.monotonic() < deadline:
        time.sleep(0.01)


if __name__ == "__main__":  # spawn imports the parent's main module in each child: guard it
    main(sys.argv[1], sys.argv[2])
