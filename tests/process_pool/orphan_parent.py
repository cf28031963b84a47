"""A parent process for the kill -9 test: starts a pool, runs a handler that sleeps, waits forever.

Usage: ``python -m tests.process_pool.orphan_parent PID_FILE``; the handler
writes its pid to PID_FILE. The test then SIGKILLs this process.
"""

from __future__ import annotations

import sys

import anyio

from taskmesh.process_pool import ProcessPool
from tests.process_pool import handlers
from tests.process_pool.support import ref


async def main(pid_file: str) -> None:
    async with ProcessPool(1, log_level="warning") as pool:
        await pool.run(ref(handlers.write_pid_and_sleep), {"pid_file": pid_file, "seconds": 60}, None)


if __name__ == "__main__":  # spawn imports the parent's main module in each child: guard it
    anyio.run(main, sys.argv[1])
