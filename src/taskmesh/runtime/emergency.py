"""The emergency exit of an instance whose event loop cannot stop by itself.

When SIGTERM came and the loop is still blocked past the grace period (an
``async`` handler calling ``time.sleep``, a C extension that never yields), or
still waits for a thread-mode ``def`` handler (a thread cannot be stopped),
``shutdown_signals.ShutdownSignals`` calls :func:`hand_back_and_exit` from its
watchdog thread. It cannot use the instance's pool or loop, so it opens one
PostgreSQL connection of its own in a fresh event loop in that thread, bounded
by ``TIMEOUT_SECONDS``, and in one statement hands back every run the
instance still holds (queued again without spending a retry, due only after
``HAND_BACK_DELAY_SECONDS`` so that nobody starts one while this process is
still exiting; the reconciler pushes them to Redis) and marks the worker
stopped. Then it ends the process with ``os._exit(EXIT_CODE)``: child
processes of sync handlers die with it (their parent-death signal), and
handler threads too (the interpreter's own exit would join them).

Log events: ``emergency_hand_back`` (warning: count, worker_id) or
``emergency_hand_back_failed`` (error: the store did not answer; the runs'
leases then expire and the reclaimer retries them).
"""

from __future__ import annotations

import asyncio
import os

import asyncpg

from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.store.classify import POSTGRES_ERRORS
from taskmesh.store.task_queries import TaskQueries
from taskmesh.store.worker_queries import WorkerQueries

log = get_logger("taskmesh.runtime.emergency")

EXIT_CODE = 1
TIMEOUT_SECONDS = 3.0
HAND_BACK_DELAY_SECONDS = 2.0
INTERRUPTED_ERROR = (
    "interrupted: the instance took its emergency exit at shutdown "
    "(its event loop was blocked, or a handler thread that cannot be stopped still ran)"
)


async def hand_back(database_url: str, worker_id: str) -> int:
    """Hand back the runs ``worker_id`` holds and mark it stopped; returns how many.

    :raises StoreError: PostgreSQL did not answer within ``TIMEOUT_SECONDS``.
    :raises TimeoutError: likewise.
    """
    try:
        # No named prepared statements: two statements, and the URL may be a transaction pooler's.
        conn = await asyncpg.connect(
            database_url, timeout=TIMEOUT_SECONDS, command_timeout=TIMEOUT_SECONDS, statement_cache_size=0
        )
    except POSTGRES_ERRORS as exc:
        raise StoreError("postgres", "connect", transient=True, detail=str(exc)) from exc
    try:
        rows = await TaskQueries(conn).hand_back_by_worker(worker_id, INTERRUPTED_ERROR, HAND_BACK_DELAY_SECONDS)
        await WorkerQueries(conn).deregister(worker_id)
        return len(rows)
    finally:
        conn.terminate()


def hand_back_and_exit(database_url: str, worker_id: str) -> None:
    """Hand back what can be handed back, then end the process (never returns)."""
    try:
        count = asyncio.run(asyncio.wait_for(hand_back(database_url, worker_id), TIMEOUT_SECONDS * 2))
        log.warning("emergency_hand_back", count=count, worker_id=worker_id)
    except (StoreError, TimeoutError) as exc:
        log.error("emergency_hand_back_failed", worker_id=worker_id, error=str(exc))
    finally:
        os._exit(EXIT_CODE)
