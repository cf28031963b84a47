"""Committer: writes run results to PostgreSQL in batches, then updates Redis.

Receives :class:`~taskmesh.models.RunResult` from every executor of the
instance and writes up to ``batch_size`` of them with one statement
(``run_finish_many``: run rows and task rows together; retries and
dead-letters go through the same batch), flushing when the batch is full or
``flush_ms`` milliseconds after its first result, whichever comes first.

When PostgreSQL fails the batch is kept and written again with backoff;
executors feel back-pressure through the bounded channel meanwhile. Ends when
every sender has closed its stream and the last batch is written.
"""

from __future__ import annotations

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from taskmesh.models import RunResult
from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.tasks import Tasks

log = structlog.get_logger("taskmesh.committer")


async def run(
    receive: MemoryObjectReceiveStream[RunResult],
    tasks: Tasks,
    *,
    worker_id: str,
    batch_size: int = 500,
    flush_ms: float = 5.0,
) -> None:
    """Commit results until the channel closes."""
    outage = Outage("committer")
    async with receive:
        while True:
            try:
                first = await receive.receive()
            except anyio.EndOfStream:
                return
            batch = [first]
            closed = await _gather(receive, batch, batch_size, flush_ms / 1000)
            while True:
                try:
                    await tasks.finish(batch, worker_id)
                except STORE_ERRORS as exc:
                    await outage.failed(exc)
                    continue
                outage.recovered()
                break
            if closed:
                return


async def _gather(
    receive: MemoryObjectReceiveStream[RunResult], batch: list[RunResult], size: int, wait: float
) -> bool:
    """Fill ``batch`` up to ``size``, waiting at most ``wait`` seconds; True when the stream ended."""
    while len(batch) < size:
        try:
            batch.append(receive.receive_nowait())
        except anyio.WouldBlock:
            break
        except anyio.EndOfStream:
            return True
    if len(batch) < size and wait > 0:
        with anyio.move_on_after(wait):
            while len(batch) < size:
                try:
                    batch.append(await receive.receive())
                except anyio.EndOfStream:
                    return True
    return False
