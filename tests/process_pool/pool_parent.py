"""A parent process for the tests of what happens to children when their parent goes.

Usage: ``python -m tests.process_pool.pool_parent MODE PID_FILE``; the handler
writes its pid to PID_FILE.

- ``sleep``: a handler sleeps a minute; the test SIGKILLs this process.
- ``exit``: a handler that ignores SIGTERM returns, and this process exits
  without closing the pool, leaving that child idle.
"""

from __future__ import annotations

import sys

import anyio

from taskmesh.process_pool import ProcessPool
from tests.process_pool import handlers
from tests.process_pool.support import ref

_pools: list[ProcessPool] = []  # still referenced at exit, as an instance's may be after a crash


async def main(mode: str, pid_file: str) -> None:
    pool = ProcessPool(1, log_level="warning")
    _pools.append(pool)
    if mode == "sleep":
        await pool.run(ref(handlers.write_pid_and_sleep), {"pid_file": pid_file, "seconds": 60}, None)
    else:
        outcome = await pool.run(ref(handlers.ignore_sigterm_and_sleep), {"pid_file": pid_file, "seconds": 0}, None)
        assert outcome.kind == "returned", outcome


if __name__ == "__main__":  # spawn imports the parent's main module in each child: guard it
    anyio.run(main, sys.argv[1], sys.argv[2])
