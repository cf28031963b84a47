"""Executor of one queue: runs claimed tasks' handlers and reports each run's end.

Receives :class:`~taskmesh.models.ClaimedTask` from the queue's fetcher, runs
the handler (``async`` on the event loop, sync in a worker thread) under the
handler's ``timeout``, decides the outcome, and sends a
:class:`~taskmesh.models.RunResult` to the committer. Outcomes (design.md
section 3):

- handler returned: ``succeeded``;
- handler raised, or overran its ``timeout``: ``retry`` after
  ``min(2**n, 3600)`` seconds while retries are left, else ``failed``;
- no handler and no fallback, a payload the handler's type cannot decode, or
  :class:`~taskmesh.errors.NonRetryableError`: ``failed`` at once;
- cancelled by an operator (through the heartbeat): ``cancelled``.

Emits ``run_finished`` log events (failures at warning, successes at debug)
with task_id, task_name, queue, attempt, trace_id, worker_id and duration_ms
(the handler's own structlog lines carry the same keys), and the runs_started,
queue_wait, runs_finished and run_duration metrics. Payloads are logged only
with ``log_payloads``.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import anyio
import orjson
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from taskmesh.errors import NonRetryableError, Retry
from taskmesh.logs import current_run, run_keys
from taskmesh.metrics import Metrics
from taskmesh.models import ClaimedTask, Outcome, RunResult, TaskContext
from taskmesh.registry import PayloadDecodeError, Registry
from taskmesh.retry import backoff_seconds

log = structlog.get_logger("taskmesh.executor")

MAX_ERROR_CHARS = 2000


def _failure(task: ClaimedTask, error: str, *, retryable: bool, delay: float | None = None) -> tuple[Outcome, float]:
    if retryable and task.retries < task.max_retries:
        return Outcome.RETRY, delay if delay is not None else float(backoff_seconds(task.retries))
    return Outcome.FAILED, 0.0


async def execute(
    task: ClaimedTask, registry: Registry, cancels: dict[uuid.UUID, anyio.CancelScope] | None = None
) -> RunResult:
    """Run one claimed task's handler and decide its outcome (never raises).

    :param cancels: shared map task id -> the run's cancel scope, through which
        the heartbeat cancels a run whose task an operator cancelled (outcome
        ``cancelled``).

    Cancellation from outside (shutdown past its grace) propagates to the caller.
    """
    handler = registry.get(task.name)
    started = time.perf_counter()
    if handler is None:
        return RunResult(task, Outcome.FAILED, error=f"no handler registered for task name {task.name!r}")
    try:
        payload = handler.decode(task.payload)
    except PayloadDecodeError as exc:
        return RunResult(task, Outcome.FAILED, error=f"payload does not fit the handler: {exc}")
    kwargs: dict[str, Any] = {}
    if handler.wants_ctx:
        kwargs["ctx"] = TaskContext(
            task_id=task.task_id,
            run_id=task.run_id,
            name=task.name,
            queue=task.queue,
            priority=task.priority,
            attempt=task.attempt,
            retries=task.retries,
            max_retries=task.max_retries,
            idempotency_key=task.idempotency_key,
            trace_id=task.trace_id,
            tenant_id=task.tenant_id,
        )
    error: str
    retryable = True
    delay: float | None = None
    deadline: anyio.CancelScope | None = None
    operator = anyio.CancelScope()
    if cancels is not None:
        cancels[task.task_id] = operator
    # No deadline scope without a timeout: a cancel scope is entered and left once per run.
    limit: AbstractContextManager[anyio.CancelScope | None] = (
        anyio.fail_after(handler.timeout) if handler.timeout is not None else nullcontext()
    )
    try:
        with operator, limit as deadline:
            if handler.is_async:
                value = await handler.func(payload, **kwargs)
            else:
                value = await anyio.to_thread.run_sync(
                    functools.partial(handler.func, payload, **kwargs), abandon_on_cancel=True
                )
        duration = time.perf_counter() - started
        if operator.cancelled_caught:
            return RunResult(task, Outcome.CANCELLED, error="cancelled", duration_seconds=duration)
        try:
            result = orjson.dumps(value).decode()
        except TypeError as exc:
            return RunResult(
                task, Outcome.FAILED, error=f"handler result is not JSON-serialisable: {exc}", duration_seconds=duration
            )
        return RunResult(task, Outcome.SUCCEEDED, result=result, duration_seconds=duration)
    except TimeoutError as exc:
        if handler.timeout is not None and deadline is not None and deadline.cancel_called:
            error = f"timed out after {handler.timeout:g} s"
        else:  # the handler's own TimeoutError (a socket, a wait_for): an ordinary failure
            error = f"{type(exc).__name__}: {exc}"
    except NonRetryableError as exc:
        error, retryable = f"NonRetryableError: {exc}", False
    except Retry as exc:
        error, delay = f"Retry: {exc}", exc.delay_seconds
    except Exception as exc:  # a handler's own failure, whatever it is, is a failed run
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if cancels is not None:
            cancels.pop(task.task_id, None)
    outcome, wait = _failure(task, error[:MAX_ERROR_CHARS], retryable=retryable, delay=delay)
    return RunResult(
        task, outcome, error=error[:MAX_ERROR_CHARS], delay_seconds=wait, duration_seconds=time.perf_counter() - started
    )


def log_keys(task: ClaimedTask, worker_id: str) -> dict[str, Any]:
    """The keys every log line about a run carries (see :func:`taskmesh.logs.run_keys`)."""
    return run_keys(task, worker_id)


async def run(
    receive: MemoryObjectReceiveStream[ClaimedTask],
    results: MemoryObjectSendStream[RunResult],
    slots: anyio.Semaphore,
    registry: Registry,
    inflight: dict[Any, ClaimedTask],
    cancels: dict[uuid.UUID, anyio.CancelScope] | None = None,
    *,
    worker_id: str,
    metrics: Metrics | None = None,
    log_payloads: bool = False,
) -> None:
    """Execute tasks until the fetcher closes the channel.

    :param inflight: shared map run_id -> task of runs started and not yet
        reported; what is left in it when the executor is cancelled is handed
        back by the supervisor.
    :param log_payloads: add the payload to failure lines (off: payloads may hold personal data).
    """
    debug_enabled = log.is_enabled_for(logging.DEBUG)
    async with receive, results:
        while True:
            # Take a buffered task without a checkpoint (a round through the event loop per
            # task); wait only when the buffer is empty. The handler's own awaits yield.
            try:
                task = receive.receive_nowait()
            except anyio.WouldBlock:
                try:
                    task = await receive.receive()
                except anyio.EndOfStream:
                    return
            except anyio.EndOfStream:
                return
            inflight[task.run_id] = task
            if metrics is not None:
                wait = time.time() - task.ready_at if task.ready_at is not None else None
                metrics.run_started(task.queue, task.name, wait)
            # The handler's own structlog lines carry the run's keys (and its trace id) too:
            # logs.py adds them from this context variable (threads of sync handlers inherit it).
            token = current_run.set((task, worker_id))
            try:
                result = await execute(task, registry, cancels)
            finally:
                current_run.reset(token)
            if metrics is not None:
                metrics.run_finished(task.queue, task.name, result.outcome.value, result.duration_seconds)
            # Successes log at debug: at thousands of runs a second a line each costs more
            # than the run. Failures always log, with every key an operator searches by.
            if result.outcome is Outcome.SUCCEEDED:
                if debug_enabled:
                    log.debug(
                        "run_finished",
                        **log_keys(task, worker_id),
                        outcome="succeeded",
                        duration_ms=round(result.duration_seconds * 1000, 3),
                    )
            else:
                extra = {"payload": task.payload} if log_payloads else {}
                log.warning(
                    "run_finished",
                    **log_keys(task, worker_id),
                    outcome=result.outcome.value,
                    duration_ms=round(result.duration_seconds * 1000, 3),
                    error=result.error,
                    retry_in_s=result.delay_seconds if result.outcome is Outcome.RETRY else None,
                    **extra,
                )
            try:
                results.send_nowait(result)
            except anyio.WouldBlock:  # the committer is behind: wait for room (back-pressure)
                await results.send(result)
            del inflight[task.run_id]
            slots.release()
