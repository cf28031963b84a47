"""Where an instance runs its ``def`` handlers: a pool of handler processes, or threads.

By default (``sync_pool = "process"``) a ``def`` handler runs in a child
process of :class:`~taskmesh.runtime.process_pool.ProcessPool` (the prefork model
users know from Celery): a run past its ``timeout``, or cancelled (by an
operator, or a shutdown past its grace), has its process stopped (SIGTERM,
then SIGKILL after ``sync_stop_grace_seconds``) before its end is recorded,
so a retry never overlaps it; a child that dies (segfault, ``os._exit``, the
OOM killer) fails that run, retried, and is replaced; CPU-bound handlers use
every core. The child imports the handler by module and name, so it must be
a module-level function.

Thread mode (``sync_pool = "thread"``, or ``@task(..., pool="thread")``, or a
handler that cannot be imported by name, such as a function defined inside
another) runs the handler in a thread of the instance, sharing its memory. A
thread cannot be stopped: a timed-out or cancelled run waits for its thread
to return before its end is recorded (its lease is kept meanwhile), so its
retry still never starts before it ends. At shutdown the instance waits for
such a thread within the grace period; :class:`HandlerThreads` counts them
for the shutdown watchdog (``shutdown_signals.py``), which treats one still
running 3 s past the grace period, or at a second signal, as a blocked loop:
the emergency exit hands its run back (due 2 s later) and ends the process
with ``os._exit``, and the thread with it (the interpreter's normal exit
would wait for it: worker threads are joined).

Logs ``sync_handler_in_thread`` (info, once per handler) when a handler
meant for a process runs in a thread, naming why.
"""

from __future__ import annotations

import functools
from typing import Any

import anyio

from taskmesh.observability.logs import get_logger
from taskmesh.runtime.process_pool import ChildOutcome, HandlerRef, ProcessPool
from taskmesh.tasks.models import ClaimedTask, TaskContext
from taskmesh.tasks.registry import Handler

log = get_logger("taskmesh.sync_handlers")

MODES = ("process", "thread")


class HandlerThreads:
    """How many ``def`` handlers run in threads right now: threads nothing can stop.

    Changed on the event loop only; :attr:`running` is read from the shutdown watchdog's
    thread (one int, read whole).
    """

    def __init__(self) -> None:
        self.running = 0


class SyncHandlers:
    """How ``def`` handlers run in one instance (see module docs).

    :param pool: the instance's process pool (``None``: every ``def`` handler runs in a thread).
    :param default: ``"process"`` or ``"thread"``: the ``sync_pool`` setting.
    :param worker_id: the instance, for the log keys of the handlers' own lines.
    :param threads: where the handlers running in threads are counted (the instance's, which its
        shutdown watchdog reads); a counter of its own by default.
    :raises ValueError: ``default`` is neither ``"process"`` nor ``"thread"``.
    """

    def __init__(
        self,
        pool: ProcessPool | None = None,
        *,
        default: str = "process",
        worker_id: str = "",
        threads: HandlerThreads | None = None,
    ) -> None:
        if default not in MODES:
            raise ValueError(f"default must be one of {MODES}")
        self.pool = pool
        self.default = default
        self.worker_id = worker_id
        self.threads = threads if threads is not None else HandlerThreads()
        self._refs: dict[str, HandlerRef | None] = {}

    def ref(self, handler: Handler) -> HandlerRef | None:
        """Where a child finds ``handler``, or ``None`` when it runs in a thread."""
        if handler.name in self._refs:
            return self._refs[handler.name]
        mode = handler.pool or self.default
        ref: HandlerRef | None = None
        if mode == "process":
            ref = HandlerRef.of(handler.func) if self.pool is not None else None
            if ref is None:
                why = "no process pool" if self.pool is None else "it cannot be imported by module and name"
                log.info("sync_handler_in_thread", handler=handler.name, reason=why)
        self._refs[handler.name] = ref
        return ref

    async def in_process(
        self, ref: HandlerRef, handler: Handler, task: ClaimedTask, ctx: TaskContext | None
    ) -> ChildOutcome:
        """Run ``handler`` in a child; cancelling the caller stops the child before it propagates.

        :raises PoolClosedError: the instance is shutting its pool down.
        """
        assert self.pool is not None
        return await self.pool.run(ref, task.payload, ctx, run=task, worker_id=self.worker_id, timeout=handler.timeout)

    async def in_thread(self, handler: Handler, payload: Any, kwargs: dict[str, Any]) -> Any:
        """Run ``handler`` in a thread; a cancel waits for the thread to return (it cannot be stopped).

        Counted in :attr:`threads` until the thread returns.
        """
        self.threads.running += 1
        try:
            return await anyio.to_thread.run_sync(
                functools.partial(handler.func, payload, **kwargs), abandon_on_cancel=False
            )
        finally:
            self.threads.running -= 1
