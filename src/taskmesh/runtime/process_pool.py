"""Pool of handler processes: runs sync (``def``) handlers in child processes it can really stop.

The prefork model: a ``def`` handler runs in a child process (spawn start
method, see :mod:`taskmesh.runtime.process_child`); a run past its timeout, or
cancelled, has its process stopped (SIGTERM, then SIGKILL after the grace) and
reaped before :meth:`ProcessPool.run` returns or raises, so the handler no
longer runs anywhere when the run's end is recorded. Children start lazily, at
most ``size`` at once; idle ones are reused; callers wait first in, first out.
Results come back on each child's pipe, awaited with ``anyio.wait_readable``
(no thread per call).

Options (:class:`ProcessPool`): ``size``; ``log_level`` ("info") and
``log_format`` ("json") of the children's structlog; ``stop_grace_seconds``
(2.0); ``preload`` (modules each child imports at start); ``start_timeout_seconds`` (60.0).

When things fail: a child that dies during a call (segfault, ``os._exit``, the
OOM killer) gives a ``died`` outcome naming its exit code or signal, is reaped,
and is replaced by the next call; one found dead while idle is replaced
without failing anything. Children die with their parent (Linux
``PR_SET_PDEATHSIG``, which fires when the *thread* that started them ends:
they are started on the event loop's thread). They are daemonic (so their
handlers cannot start ``multiprocessing`` children), and an exit hook SIGKILLs
those of a pool never closed. Like any spawn start, each child imports the
parent's main module unless it ran with ``-m``: a script must guard its start
with ``if __name__ == "__main__"`` or every child dies at start.

Log events (fixed keys; inside a run, :mod:`taskmesh.observability.logs` adds the run's):

- ``handler_process_started`` (pid), info;
- ``handler_process_stopped`` (pid; reason: timed_out, cancelled, start_timeout,
  pipe_closed or pool_closed; signal: the last sent; exit: "signal SIGTERM",
  "exit code 0"...), info, warning when it took SIGKILL;
- ``handler_process_died`` (pid, exit, during: start, call or idle), warning;
- ``handler_process_not_reaped`` (pid), error: still there after SIGKILL.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import os
import pickle
import signal
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from types import TracebackType
from typing import Any, Literal

import anyio

from taskmesh.errors import TaskmeshError
from taskmesh.observability.logs import get_logger
from taskmesh.runtime.process_child import READY, Call, ChildOutcome, child_main, describe
from taskmesh.tasks.models import ClaimedTask, TaskContext

__all__ = ["ChildOutcome", "HandlerRef", "PoolClosedError", "ProcessPool"]

log = get_logger("taskmesh.runtime.process_pool")

_LOG_LEVELS = ("debug", "info", "warning", "error")
_LOG_FORMATS = ("json", "console", "auto")
_KILL_WAIT_SECONDS = 1.0  # SIGKILL cannot be ignored; longer means a process stuck in the kernel
_REAP_POLL_SECONDS = 0.005

StopReason = Literal["timed_out", "cancelled", "start_timeout", "pipe_closed", "pool_closed"]


class PoolClosedError(TaskmeshError, RuntimeError):
    """The process pool is closed: it runs no more handlers."""


@dataclass(frozen=True, slots=True)
class HandlerRef:
    """Where a handler function lives, so a child can import it by name.

    :param module: the module's import name, e.g. ``"myapp.tasks"``.
    :param qualname: the function's qualified name in it, e.g. ``"export"`` or ``"Jobs.export"``.
    """

    module: str
    qualname: str

    @classmethod
    def of(cls, func: Callable[..., Any]) -> HandlerRef | None:
        """Where ``func`` can be imported from in a fresh process.

        :returns: ``None`` when it cannot be: a closure or nested function
            (``<locals>``), a lambda, a function of ``__main__``, a bound
            method, or one that ``module.qualname`` does not name (the name now
            holds something else). The caller then runs ``func`` in a thread.
        """
        module = getattr(func, "__module__", None)
        qualname = getattr(func, "__qualname__", None)
        if not isinstance(module, str) or not isinstance(qualname, str):
            return None
        if module in ("__main__", "__mp_main__") or "<" in qualname:  # <locals>, <lambda>
            return None
        try:
            target: Any = importlib.import_module(module)
            for part in qualname.split("."):
                target = getattr(target, part)
        except Exception:  # importing runs module code; any failure means "not importable by name"
            return None
        return cls(module, qualname) if target is func else None


@dataclass(eq=False, slots=True)
class _Child:
    process: SpawnProcess
    conn: Connection[Any, ChildOutcome | str]
    pid: int


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


_open_pools: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


@atexit.register
def _kill_children_at_exit() -> None:
    # An interpreter exiting with a pool never closed: multiprocessing's own exit hook (which
    # runs after this one, atexit being last in, first out) SIGTERMs daemonic children and then
    # waits for them, forever for one whose handler ignored SIGTERM. SIGKILL them first.
    for pool in list(_open_pools):
        for child in list(pool._children):
            if child.process.exitcode is None:
                child.process.kill()


class ProcessPool:
    """Child processes that run sync handlers, at most ``size`` at once (see the module docs).

    :param size: children at most, >= 1; also the number of concurrent calls.
    :param log_level: the children's structlog level (debug, info, warning, error).
    :param log_format: the children's structlog format (json, console, auto).
    :param stop_grace_seconds: seconds between SIGTERM and SIGKILL when a child is stopped, > 0.
    :param preload: modules each child imports when it starts (the instance's handler modules).
    :param start_timeout_seconds: seconds a new child may take to be ready, > 0.
    :raises ValueError: an option out of range.

    Use it from one event loop, as ``async with ProcessPool(...) as pool`` or
    with an explicit :meth:`aclose`.
    """

    def __init__(
        self,
        size: int,
        *,
        log_level: str = "info",
        log_format: str = "json",
        stop_grace_seconds: float = 2.0,
        preload: Sequence[str] = (),
        start_timeout_seconds: float = 60.0,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        if log_level not in _LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(_LOG_LEVELS)}")
        if log_format not in _LOG_FORMATS:
            raise ValueError(f"log_format must be one of {', '.join(_LOG_FORMATS)}")
        if stop_grace_seconds <= 0 or start_timeout_seconds <= 0:
            raise ValueError("stop_grace_seconds and start_timeout_seconds must be positive")
        self.size = size
        self._log_level = log_level
        self._log_format = log_format
        self._grace = stop_grace_seconds
        self._preload = tuple(preload)
        self._start_timeout = start_timeout_seconds
        self._context = multiprocessing.get_context("spawn")
        self._slots = anyio.Semaphore(size)  # FIFO: waiters are served in arrival order
        self._children: set[_Child] = set()
        self._idle: list[_Child] = []
        self._closed = False
        _open_pools.add(self)

    @property
    def alive(self) -> int:
        """Children running now (starting, idle or busy)."""
        return len(self._children)

    @property
    def busy(self) -> int:
        """Children starting for a call, running one, or being stopped."""
        return len(self._children) - len(self._idle)

    async def __aenter__(self) -> ProcessPool:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def run(
        self,
        ref: HandlerRef,
        payload: Any,
        ctx: TaskContext | None,
        *,
        run: ClaimedTask | None = None,
        worker_id: str = "",
        # It counts from the call's start in a child, not from the wait for one: no outer scope can do that.
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> ChildOutcome:
        """Call the handler ``ref`` with ``payload`` in a child process and wait for the outcome.

        :param ref: the handler, imported by name in the child (see :meth:`HandlerRef.of`).
        :param payload: the task's payload as stored (JSON data), decoded in the child
            into the handler's declared type.
        :param ctx: passed as ``ctx=`` when the handler declares it.
        :param run: the claimed task, whose keys (task_id, task_name, queue,
            attempt, trace_id) and ``worker_id`` the handler's log lines carry.
        :param timeout: seconds from the moment a child starts the call (waiting
            for a free child does not count); past it the child is stopped and
            the outcome is ``timed_out``. ``None``: no limit.
        :returns: the outcome; a handler's failure is an outcome, never an exception.
        :raises PoolClosedError: the pool was closed before a child was free.
        :raises ValueError: ``timeout`` is not positive.

        Cancelling the caller stops the child running this call (SIGTERM, then
        SIGKILL after the grace) and reaps it before the cancellation goes on.
        """
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds")
        if self._closed:
            raise PoolClosedError()
        try:
            data = pickle.dumps(
                Call(ref.module, ref.qualname, payload, ctx, run, worker_id).light(), pickle.HIGHEST_PROTOCOL
            )
        except Exception as exc:  # pickling runs the payload's own code; any failure is the payload's
            error = f"payload cannot be sent to a handler process: {describe(exc)}"
            return ChildOutcome("raised", error=error, retryable=False)
        async with self._slots:
            if self._closed:
                raise PoolClosedError()
            child = self._take_idle()
            if child is None:
                started = await self._start()
                if isinstance(started, ChildOutcome):
                    return started
                child = started
            return await self._call(child, data, timeout)

    async def aclose(self) -> None:
        """Stop every child (SIGTERM, then SIGKILL after the grace) and reap it. Safe to call twice.

        Callers waiting for a free child get :class:`PoolClosedError`; a call in
        progress ends as ``died``.
        """
        # Stays in _open_pools: a child still unreaped after this (stuck in the kernel) is the exit hook's.
        self._closed = True
        idle, self._idle = self._idle, []
        await self._stop(list(self._children), "pool_closed")
        # Busy children's pipes are closed by the calls waiting on them, which see end of file.
        for child in idle:
            self._forget(child)

    def _take_idle(self) -> _Child | None:
        while self._idle:
            child = self._idle.pop()  # the most recently used: its caches are warm
            code = child.process.exitcode
            if code is None:
                return child
            # Killed while idle (the OOM killer, an operator): nothing failed; start another.
            log.warning("handler_process_died", pid=child.pid, exit=_exit_text(code), during="idle")
            self._forget(child)
        return None

    async def _start(self) -> _Child | ChildOutcome:
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=child_main,
            args=(child_conn, os.getpid(), self._log_level, self._log_format, self._preload),
            name="taskmesh-handler",
            daemon=True,
        )
        try:
            # On this (the event loop's) thread, never a worker thread: PR_SET_PDEATHSIG fires
            # when the thread that started the child ends, and anyio ends idle worker threads.
            process.start()
        except OSError as exc:  # fork or pipe limits: a later attempt may find room
            parent_conn.close()
            return ChildOutcome("died", error=f"handler process could not start: {describe(exc)}")
        finally:
            child_conn.close()  # the child has its copy; ours would hide its end of file
        child = _Child(process, parent_conn, process.pid or 0)
        self._children.add(child)
        log.info("handler_process_started", pid=child.pid)
        started = time.perf_counter()
        try:
            with anyio.move_on_after(self._start_timeout) as deadline:
                message = await self._receive(child)
        except BaseException:  # cancelled while starting: the child must not outlive this call
            await self._discard(child, "cancelled")
            raise
        if message == READY:
            return child
        if deadline.cancelled_caught:
            await self._discard(child, "start_timeout")
            error = f"handler process did not start within {self._start_timeout:g} s"
            return ChildOutcome("died", error=error, duration_seconds=time.perf_counter() - started)
        return await self._died(child, started, "start")

    async def _call(self, child: _Child, data: bytes, timeout: float | None) -> ChildOutcome:  # noqa: ASYNC109 (as run)
        started = time.perf_counter()
        try:
            # Blocking, but the child is idle in recv() and drains the pipe at once.
            child.conn.send_bytes(data)
        except OSError:  # died between the liveness check and the send
            return await self._died(child, started, "call")
        try:
            with anyio.move_on_after(timeout) as deadline:
                message = await self._receive(child)
        except BaseException:  # cancelled: stop the handler before the cancellation goes on
            await self._discard(child, "cancelled")
            raise
        if deadline.cancelled_caught:
            await self._discard(child, "timed_out")
            assert timeout is not None  # a deadline only exists with a timeout
            return ChildOutcome(
                "timed_out", error=f"timed out after {timeout:g} s", duration_seconds=time.perf_counter() - started
            )
        if isinstance(message, ChildOutcome):
            self._idle.append(child)
            return message
        return await self._died(child, started, "call")

    @staticmethod
    async def _receive(child: _Child) -> ChildOutcome | str | None:
        """The child's next message; ``None`` when its end of the pipe closed (it exited)."""
        await anyio.wait_readable(child.conn.fileno())
        try:
            # One message per wake-up; recv() may block for the rest of a large one, which the
            # child is writing in one go.
            return child.conn.recv()
        except (EOFError, OSError):
            return None

    async def _died(self, child: _Child, started: float, during: Literal["start", "call"]) -> ChildOutcome:
        # Shielded like _stop: a cancellation arriving now must not leave the child unreaped.
        with anyio.CancelScope(shield=True):
            # Its pipe closed because it is exiting: give it a moment to become reapable.
            await self._reap_all([child], _KILL_WAIT_SECONDS)
            code = child.process.exitcode
            if code is None:  # the pipe closed, the process did not (a handler closed the descriptor)
                await self._stop([child], "pipe_closed")
                code = child.process.exitcode
        self._forget(child)
        duration = time.perf_counter() - started
        if self._closed:
            return ChildOutcome("died", error="handler process stopped: the pool was closed", duration_seconds=duration)
        log.warning("handler_process_died", pid=child.pid, exit=_exit_text(code), during=during)
        return ChildOutcome("died", error=f"handler process died ({_exit_text(code)})", duration_seconds=duration)

    async def _discard(self, child: _Child, reason: StopReason) -> None:
        await self._stop([child], reason)
        self._forget(child)

    async def _stop(self, children: Sequence[_Child], reason: StopReason) -> None:
        """SIGTERM ``children``, SIGKILL those still there after the grace, and reap them.

        Shielded and bounded (grace + 1 s): it runs on the way out of a cancellation.
        """
        with anyio.CancelScope(shield=True):
            sent = {child: "SIGTERM" for child in children if child.process.exitcode is None}
            for child in sent:
                child.process.terminate()
            await self._reap_all(list(sent), self._grace)
            for child in sent:
                if child.process.exitcode is None:
                    child.process.kill()
                    sent[child] = "SIGKILL"
            await self._reap_all(list(sent), _KILL_WAIT_SECONDS)
            for child, sig in sent.items():
                # A handler that needed SIGKILL ignores or outlasts SIGTERM: worth a warning.
                emit = log.warning if sig == "SIGKILL" else log.info
                exit_text = _exit_text(child.process.exitcode)
                emit("handler_process_stopped", pid=child.pid, reason=reason, signal=sig, exit=exit_text)

    async def _reap_all(self, children: Sequence[_Child], within: float) -> None:
        deadline = anyio.current_time() + within
        # No event tells of a child's exit short of SIGCHLD (which the event loop may own); this polls
        # waitpid only while stopping children, for a bounded time.
        while any(c.process.exitcode is None for c in children) and anyio.current_time() < deadline:  # noqa: ASYNC110
            await anyio.sleep(_REAP_POLL_SECONDS)

    def _forget(self, child: _Child) -> None:
        if child not in self._children:
            return
        if child.process.exitcode is None:  # SIGKILLed, yet stuck in the kernel: keep it for aclose()
            log.error("handler_process_not_reaped", pid=child.pid)
            return
        self._children.discard(child)
        # Not process.close(): another task may still read its exit code; the object goes with it.
        child.conn.close()
