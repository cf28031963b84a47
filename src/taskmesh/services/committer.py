"""Committer: writes run results to PostgreSQL in batches, then updates Redis.

Executors hand results over with :meth:`Committer.submit` (a bounded channel:
when the committer is behind, executors wait, and fetching pauses). The
committer writes up to ``batch_size`` of them with one statement
(``run_finish_many``: run rows and task rows together), flushing when the batch
is full or ``flush_ms`` milliseconds after its first result, and, while results
keep coming, no sooner than ``interval_ms`` after the previous write began. A
lone result waits ``flush_ms``; a steady stream is written in one commit per
``interval_ms`` instead of one per result or two: a commit costs PostgreSQL and
the instance far more CPU than a row, and that CPU is taken from the handlers
(5 ms ``def`` tasks drained 4-16% faster with writes at most every 25 ms than
with one write per batch of one or two results, side by side, 2026-12-04).

Failure model:

- a **transient** store error (an outage) keeps the batch and writes it again
  with backoff (``store_unavailable`` once per outage);
- a **non-transient** error (PostgreSQL refuses a value) splits the batch in
  halves until the offending result is alone; that run is then written with
  its result dropped and its error replaced by one that says why
  (``result_refused``, at error), and if even that is refused it is dropped
  (``result_dropped``): its lease then expires and the reclaimer retries it.
  Every other result of the batch is written. One bad value never stops the
  results of an instance again.

Until a result is written its run counts as *held*: the heartbeat keeps its
lease (``unwritten``). A restart after a crash goes on with the batch in hand.
At shutdown :meth:`close` ends the input; :meth:`run` returns once everything
submitted is written, or when the supervisor's deadline cancels it, in which
case every unwritten result is logged (``results_unwritten``, then one
``result_unwritten`` line per run with its keys).
"""

from __future__ import annotations

import uuid

import anyio

from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger, run_keys
from taskmesh.services.base import Outage
from taskmesh.tasks.models import ClaimedTask, Outcome, RunResult
from taskmesh.tasks.storable import storable_text
from taskmesh.tasks.tasks import Tasks

log = get_logger("taskmesh.committer")


class Committer:
    """The instance's one writer of run results (see module docs).

    :param tasks: the task facade.
    :param worker_id: this instance (the fence: only its own running runs are written).
    :param batch_size: most results per statement.
    :param flush_ms: longest a result waits for companions after a quiet spell, milliseconds.
    :param interval_ms: least time between the starts of two writes while results keep
        coming, milliseconds (0: write as soon as ``flush_ms`` has passed).
    :param capacity: results the channel buffers before executors wait.
    """

    def __init__(
        self,
        tasks: Tasks,
        worker_id: str,
        *,
        batch_size: int = 500,
        flush_ms: float = 5.0,
        interval_ms: float = 0.0,
        capacity: int = 1024,
    ) -> None:
        self.tasks = tasks
        self.worker_id = worker_id
        self.batch_size = batch_size
        self.flush_seconds = flush_ms / 1000
        self.interval_seconds = interval_ms / 1000
        self._last_write = float("-inf")
        """When the last write began (``anyio.current_time``)."""
        self._send, self._receive = anyio.create_memory_object_stream[RunResult](capacity)
        self.unwritten: dict[uuid.UUID, ClaimedTask] = {}
        """Runs whose result was submitted and is not written yet, by run id."""
        self._batch: list[RunResult] = []
        self._outage = Outage("committer")
        self._closed = False

    async def submit(self, result: RunResult) -> None:
        """Hand a result over; waits while the channel is full (back-pressure)."""
        self.unwritten[result.task.run_id] = result.task
        try:
            self._send.send_nowait(result)
        except anyio.WouldBlock:
            await self._send.send(result)

    def close(self) -> None:
        """No more results will come: :meth:`run` returns once the last one is written."""
        self._closed = True
        self._send.close()

    def release(self) -> None:
        """Close both ends of the channel: the instance is done with this committer.

        For the owner once :meth:`run` has returned for good, or never ran (the channel's
        streams warn when collected open). Anything still buffered is dropped from the
        channel, not from :attr:`unwritten`. Calling it again does nothing.
        """
        self._closed = True
        self._send.close()
        self._receive.close()

    async def run(self) -> None:
        """Write results until :meth:`close` was called and everything is written."""
        try:
            while True:
                if not self._batch:
                    try:
                        self._batch.append(await self._receive.receive())
                    except anyio.EndOfStream:
                        self._receive.close()
                        return
                ended = await self._gather()
                self._last_write = anyio.current_time()
                await self._write(self._batch)
                self._batch = []
                if ended:
                    self._receive.close()
                    return
        except anyio.get_cancelled_exc_class():
            self._report_unwritten()
            raise

    async def _gather(self) -> bool:
        """Fill the batch up to its size, waiting the flush time, or until ``interval_ms`` after the
        last write began if that is later; True when the input ended."""
        batch = self._batch
        while len(batch) < self.batch_size:
            try:
                batch.append(self._receive.receive_nowait())
            except anyio.WouldBlock:
                break
            except anyio.EndOfStream:
                return True
        wait = max(self.flush_seconds, self._last_write + self.interval_seconds - anyio.current_time())
        if len(batch) < self.batch_size and wait > 0:
            with anyio.move_on_after(wait):
                while len(batch) < self.batch_size:
                    try:
                        batch.append(await self._receive.receive())
                    except anyio.EndOfStream:
                        return True
        return False

    async def _write(self, batch: list[RunResult]) -> None:
        """Write ``batch``, through outages, isolating any result PostgreSQL refuses."""
        while True:
            try:
                await self.tasks.finish(batch, self.worker_id)
            except StoreError as exc:
                if exc.transient:
                    await self._outage.failed(exc)
                    continue
                self._outage.recovered()
                if len(batch) > 1:
                    half = len(batch) // 2
                    await self._write(batch[:half])
                    await self._write(batch[half:])
                else:
                    await self._refused(batch[0], exc)
                return
            self._outage.recovered()
            for r in batch:
                self.unwritten.pop(r.task.run_id, None)
            return

    async def _refused(self, result: RunResult, exc: StoreError) -> None:
        """PostgreSQL refused this one result: write what can be written, or drop it."""
        log.error(
            "result_refused", **run_keys(result.task, self.worker_id), outcome=result.outcome.value, error=exc.detail
        )
        if result.outcome is Outcome.SUCCEEDED:
            fallback = RunResult(
                result.task,
                Outcome.FAILED,
                error=storable_text(f"the handler's result could not be stored: {exc.detail}", 2000),
                duration_seconds=result.duration_seconds,
            )
        else:
            fallback = RunResult(
                result.task,
                result.outcome,
                error=storable_text(f"the run's error could not be stored: {exc.detail}", 2000),
                delay_seconds=result.delay_seconds,
                duration_seconds=result.duration_seconds,
            )
        while True:
            try:
                await self.tasks.finish([fallback], self.worker_id)
            except StoreError as again:
                if again.transient:
                    await self._outage.failed(again)
                    continue
                log.error("result_dropped", **run_keys(result.task, self.worker_id), error=again.detail)
            break
        self.unwritten.pop(result.task.run_id, None)

    def _report_unwritten(self) -> None:
        if not self.unwritten:
            return
        log.warning("results_unwritten", count=len(self.unwritten), worker_id=self.worker_id)
        for task in self.unwritten.values():
            log.warning("result_unwritten", **run_keys(task, self.worker_id))
