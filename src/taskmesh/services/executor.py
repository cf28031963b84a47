"""Executor: runs one claimed task's handler and decides how its run ended.

:func:`execute` runs the handler (``async`` on the event loop; ``def`` in a
handler process of the instance's pool, or a thread in thread mode: see
``sync_handlers.py``)
under the handler's ``timeout``, and returns a
:class:`~taskmesh.tasks.models.RunResult` whose texts PostgreSQL can store
(``taskmesh.tasks.storable``). It never raises but for cancellation from outside (an
operator's cancel arrives through ``cancels``; a shutdown past its grace
cancels the caller). Outcomes (docs/internals/design.md section 3):

- handler returned: ``succeeded`` (a result PostgreSQL cannot store fails the
  run, not retried, naming where the bad character is);
- handler raised, or overran its ``timeout``: ``retry`` after the backoff
  (``min(2**n, 3600)`` s with jitter) while retries are left, else ``failed``;
  the traceback is kept (16 KiB, the innermost frames);
- no handler and no fallback, a payload the handler's type cannot decode, a
  row this version cannot read, or :class:`~taskmesh.errors.NonRetryableError`:
  ``failed`` at once;
- a name only the fallback (the dev profile's demo) would run while a live instance
  advertises a handler for it (``advertised.py``): ``failed`` at once, naming that
  instance and the handler's queue to retry it on. The demo must not "complete" a task
  a real handler was waiting for; handing it back could loop for ever when that
  instance does not serve the task's queue, and a failed task is in sight, one retry
  (with ``queue_name``) away from its handler;
- cancelled by an operator (through the heartbeat): ``cancelled``.

:func:`run_loop` is one executor slot of a queue (see ``worker_pool``): it
takes claimed tasks from the queue's channel, executes them and hands each
result to the committer, logging ``run_finished`` (failures at warning with
the error and traceback, successes at debug) with the run's keys and counting
``runs_started``, ``queue_wait``, ``runs_finished`` and ``run_duration``. A bug
in that bookkeeping fails the one run (retried, ``internal error``), never the
slot.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import anyio

from taskmesh.errors import NonRetryableError, PayloadDecodeError, RateLimited, Retry
from taskmesh.observability.logs import current_run, get_logger, run_keys
from taskmesh.observability.metrics import Metrics
from taskmesh.runtime.process_pool import HandlerRef, PoolClosedError
from taskmesh.services.sync_handlers import SyncHandlers
from taskmesh.tasks.advertised import Advertisement
from taskmesh.tasks.models import ClaimedTask, Outcome, RunResult
from taskmesh.tasks.registry import Handler, Registry
from taskmesh.tasks.retry import backoff_seconds
from taskmesh.tasks.storable import (
    MAX_ERROR_CHARS,
    MAX_TRACEBACK_CHARS,
    describe,
    storable_json,
    storable_result,
    storable_text,
)
from taskmesh.tasks.tasks import DEFAULT_QUEUE

log = get_logger("taskmesh.executor")


def failure(
    task: ClaimedTask,
    error: str,
    *,
    retryable: bool,
    delay: float | None = None,
    duration: float = 0.0,
    trace: str | None = None,
) -> RunResult:
    """The result of a failed run: ``retry`` while retries are left and it may retry, else ``failed``.

    :param delay: the handler's own wait (``Retry(delay_seconds=...)``); default the jittered backoff.
    """
    text = storable_text(error, MAX_ERROR_CHARS)
    tb = storable_text(trace, MAX_TRACEBACK_CHARS, keep_end=True) if trace else None
    if retryable and task.retries < task.max_retries:
        wait = delay if delay is not None else backoff_seconds(task.retries, jitter=True)
        return RunResult(task, Outcome.RETRY, error=text, delay_seconds=wait, duration_seconds=duration, traceback=tb)
    return RunResult(task, Outcome.FAILED, error=text, duration_seconds=duration, traceback=tb)


def rate_limited(task: ClaimedTask, error: str, seconds: float, duration: float) -> RunResult:
    """The result of a run whose handler raised ``RateLimited``: back to wait ``seconds`` (no retry spent),
    its limit keys held back as long (``RunResult.back_off_seconds``)."""
    text = storable_text(f"{error} (waits {seconds:g} s, no retry spent)", MAX_ERROR_CHARS)
    return RunResult(
        task,
        Outcome.INTERRUPTED,
        error=text,
        delay_seconds=seconds,
        duration_seconds=duration,
        back_off_seconds=seconds,
    )


async def execute(
    task: ClaimedTask,
    registry: Registry,
    cancels: dict[uuid.UUID, anyio.CancelScope] | None = None,
    sync: SyncHandlers | None = None,
    advertised: Advertised | None = None,
) -> RunResult:
    """Run one claimed task's handler and decide its outcome (see module docs; never raises).

    :param cancels: shared map task id -> the run's cancel scope, through which
        the heartbeat cancels a run whose task an operator cancelled (outcome ``cancelled``).
    :param sync: how ``def`` handlers run (a process pool, or threads; default threads).
    :param advertised: what a live instance advertises for a task name
        (:meth:`~taskmesh.tasks.tasks.Tasks.advertised_handler`), asked before the fallback runs a name.
    """
    # Named so that the event-loop monitor can tell which run blocks the loop (loop_monitor.py).
    _taskmesh_run = task
    if task.defect is not None:
        return RunResult(task, Outcome.FAILED, error=storable_text(task.defect, MAX_ERROR_CHARS))
    handler = registry.get(task.name)
    if handler is None:
        return RunResult(task, Outcome.FAILED, error=f"no handler registered for task name {task.name!r}")
    if task.timeout is not None:  # a workflow node's own timeout wins over its handler's
        handler = dataclasses.replace(handler, timeout=task.timeout)
    if advertised is not None and task.name not in registry:
        theirs = await advertised(task.name)
        if theirs is not None:
            return RunResult(task, Outcome.FAILED, error=_not_for_the_fallback(task, theirs))
    sync = sync or _THREADS
    if not handler.is_async:
        ref = sync.ref(handler)
        if ref is not None:
            return await _in_process(task, handler, ref, sync, cancels)
    try:
        payload = handler.decode(task.payload)
    except PayloadDecodeError as exc:
        error = storable_text(f"payload does not fit the handler: {exc}", MAX_ERROR_CHARS)
        return RunResult(task, Outcome.FAILED, error=error)
    kwargs: dict[str, Any] = {"ctx": task.context()} if handler.wants_ctx else {}
    operator = anyio.CancelScope()
    if cancels is not None:
        cancels[task.task_id] = operator
    # No deadline scope without a timeout: a cancel scope is entered and left once per run.
    limit: AbstractContextManager[anyio.CancelScope | None] = (
        anyio.fail_after(handler.timeout) if handler.timeout is not None else nullcontext()
    )
    started = time.perf_counter()
    deadline: anyio.CancelScope | None = None
    try:
        with operator, limit as deadline:
            if handler.is_async:
                value = await handler.func(payload, **kwargs)
            else:
                value = await sync.in_thread(handler, payload, kwargs)
        duration = time.perf_counter() - started
        # A thread cannot be stopped: it returns when it is done, and the cancel that came
        # meanwhile is not "caught". It still counts as what it was.
        if operator.cancel_called:
            return RunResult(task, Outcome.CANCELLED, error="cancelled", duration_seconds=duration)
        if deadline is not None and deadline.cancel_called:
            return failure(task, f"timed out after {handler.timeout:g} s", retryable=True, duration=duration)
        result, refused = storable_result(value)
        if refused is not None:
            return RunResult(
                task, Outcome.FAILED, error=storable_text(refused, MAX_ERROR_CHARS), duration_seconds=duration
            )
        return RunResult(task, Outcome.SUCCEEDED, result=result, duration_seconds=duration)
    except TimeoutError as exc:
        duration = time.perf_counter() - started
        if handler.timeout is not None and deadline is not None and deadline.cancel_called:
            return failure(task, f"timed out after {handler.timeout:g} s", retryable=True, duration=duration)
        # the handler's own TimeoutError (a socket, a wait_for): an ordinary failure
        return failure(task, describe(exc), retryable=True, duration=duration, trace=_trace(exc))
    except RateLimited as exc:
        return rate_limited(task, describe(exc), exc.retry_after, time.perf_counter() - started)
    except NonRetryableError as exc:
        duration = time.perf_counter() - started
        return failure(task, describe(exc), retryable=False, duration=duration, trace=_trace(exc))
    except Retry as exc:
        duration = time.perf_counter() - started
        return failure(
            task, describe(exc), retryable=True, delay=exc.delay_seconds, duration=duration, trace=_trace(exc)
        )
    except Exception as exc:  # a handler's own failure, whatever it is, is a failed run
        duration = time.perf_counter() - started
        return failure(task, describe(exc), retryable=True, duration=duration, trace=_trace(exc))
    finally:
        if cancels is not None:
            cancels.pop(task.task_id, None)


Advertised = Callable[[str], Awaitable[Advertisement | None]]
"""What a live instance advertises for a task name (``None``: none does)."""


def _not_for_the_fallback(task: ClaimedTask, theirs: Advertisement) -> str:
    queue = theirs.queue or DEFAULT_QUEUE
    return (
        f"not run by the fallback handler: live instance {theirs.worker_id} has a handler for {task.name!r} "
        f"(queue {queue!r}); retry it there: POST /api/v1/tasks/{task.task_id}/retry "
        f'{{"queue_name": "{queue}"}}'
    )


_THREADS = SyncHandlers(None, default="thread")
"""Without a process pool (tests, the client): ``def`` handlers run in threads."""


async def _in_process(
    task: ClaimedTask,
    handler: Handler,
    ref: HandlerRef,
    sync: SyncHandlers,
    cancels: dict[uuid.UUID, anyio.CancelScope] | None,
) -> RunResult:
    """Run a ``def`` handler in a handler process; its outcome becomes the run's result.

    The timeout is the pool's (it counts from the call's start in a child); a cancel
    stops the child before the run's end is recorded.
    """
    _taskmesh_run = task
    operator = anyio.CancelScope()
    if cancels is not None:
        cancels[task.task_id] = operator
    started = time.perf_counter()  # a stopped child reports no duration of its own
    try:
        with operator:
            outcome = await sync.in_process(ref, handler, task, task.context() if handler.wants_ctx else None)
    except PoolClosedError:
        return failure(
            task,
            "handler process pool closed: the instance is stopping",
            retryable=True,
            duration=time.perf_counter() - started,
        )
    finally:
        if cancels is not None:
            cancels.pop(task.task_id, None)
    if operator.cancel_called:
        return RunResult(task, Outcome.CANCELLED, error="cancelled", duration_seconds=time.perf_counter() - started)
    duration = outcome.duration_seconds
    if outcome.kind == "returned":
        result, refused = storable_json(outcome.result_json or "null")
        if refused is not None:
            return RunResult(
                task, Outcome.FAILED, error=storable_text(refused, MAX_ERROR_CHARS), duration_seconds=duration
            )
        return RunResult(task, Outcome.SUCCEEDED, result=result, duration_seconds=duration)
    error = outcome.error or outcome.kind
    if outcome.kind == "raised" and outcome.rate_limited is not None:
        return rate_limited(task, error, outcome.rate_limited, duration)
    delay = outcome.retry_delay if outcome.kind == "raised" else None
    return failure(task, error, retryable=outcome.retryable, delay=delay, duration=duration, trace=outcome.traceback)


def _trace(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except Exception:  # a broken __str__ inside the chain
        return describe(exc)


def log_finished(task: ClaimedTask, result: RunResult, worker_id: str, *, debug: bool, log_payloads: bool) -> None:
    """Log a run's end: failures at warning with error and traceback, successes at debug only.

    At thousands of runs a second a line per success costs more than the run; the
    metrics count every run.
    """
    if result.outcome is Outcome.SUCCEEDED:
        if debug:
            log.debug(
                "run_finished",
                **run_keys(task, worker_id),
                outcome="succeeded",
                duration_ms=round(result.duration_seconds * 1000, 3),
            )
        return
    extra: dict[str, Any] = {"payload": task.payload} if log_payloads else {}
    if result.traceback:
        extra["traceback"] = result.traceback
    log.warning(
        "run_finished",
        **run_keys(task, worker_id),
        outcome=result.outcome.value,
        duration_ms=round(result.duration_seconds * 1000, 3),
        error=result.error,
        retry_in_s=round(result.delay_seconds, 3) if result.outcome is Outcome.RETRY else None,
        **extra,
    )


async def run_one(
    task: ClaimedTask,
    *,
    registry: Registry,
    cancels: dict[uuid.UUID, anyio.CancelScope],
    sync: SyncHandlers,
    worker_id: str,
    metrics: Metrics | None,
    debug: bool,
    log_payloads: bool,
    now: Callable[[], float] = time.time,
    advertised: Advertised | None = None,
) -> RunResult:
    """Execute ``task`` with its bookkeeping (metrics, the log context, the end line).

    A bug in the bookkeeping fails the run with ``internal error`` (retried with
    backoff, so it ends in the DLQ if it always happens), never the executor.

    :param now: PostgreSQL's time in epoch seconds (``StoreClock.timestamp``): the task's
        ``ready_at`` is its ``run_at``, by PostgreSQL's clock, so its wait is measured on that one.
    :param advertised: as :func:`execute`'s (given when the registry has a fallback).
    """
    try:
        if metrics is not None:
            wait = now() - task.ready_at if task.ready_at is not None else None
            metrics.run_started(task.queue, task.name, wait)
        # The handler's own structlog lines carry the run's keys (and its trace id) too:
        # logs.py adds them from this context variable (threads of sync handlers inherit it).
        token = current_run.set((task, worker_id))
        try:
            result = await execute(task, registry, cancels, sync, advertised)
        finally:
            current_run.reset(token)
        if metrics is not None:
            metrics.run_finished(task.queue, task.name, result.outcome.value, result.duration_seconds)
        log_finished(task, result, worker_id, debug=debug, log_payloads=log_payloads)
        return result
    except Exception as exc:  # taskmesh's own bug: fail this run, keep the executor
        log.error("executor_error", **run_keys(task, worker_id), error=describe(exc), exc_info=True)
        return failure(task, f"internal error in the executor: {describe(exc)}", retryable=True, trace=_trace(exc))


def debug_enabled() -> bool:
    """Whether ``run_finished`` lines of successes are logged (level debug)."""
    return bool(log.is_enabled_for(logging.DEBUG))


Submit = Callable[[RunResult], Awaitable[None]]
