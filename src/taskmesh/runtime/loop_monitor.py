"""Event-loop block detector: notices that the loop has stopped turning and names the run that holds it.

An async ticker (:meth:`LoopMonitor.run`, one task on the loop) stamps
``time.monotonic()`` every ``tick_seconds`` (0.1); a daemon watcher thread
(``taskmesh-loop-monitor``) looks at the stamp as often. A stamp older than
``threshold_seconds`` (setting ``loop_block_threshold_seconds``, default 1.0)
means something on the loop thread runs without awaiting: an ``async``
handler calling ``time.sleep``, a CPU-bound loop, a blocking client.

Each blocking *episode* gives one warning when it crosses the threshold and
one line when it ends, however long it lasts. To say what blocks, the watcher
reads the loop thread's stack (``sys._current_frames()``) and walks it from
the innermost frame outwards to the first frame with a local named
``_taskmesh_run`` (:data:`RUN_LOCAL`) holding a
:class:`~taskmesh.tasks.models.ClaimedTask`: the executor keeps one in the function
that awaits the handler, so the blocking code belongs to that run.

Reads and writes no store. Nothing here can stop the loop or the instance: it
only observes; :mod:`taskmesh.runtime.shutdown_signals` asks :meth:`LoopMonitor.is_blocked`
to decide whether a shutdown needs the emergency exit. A failure to read the
stack (a frame gone between two reads) leaves the warning without stack or run
keys; it never stops the watcher.

Log events (logger ``taskmesh.runtime.loop_monitor``):

- ``event_loop_blocked`` (warning): ``blocked_for_s``, ``threshold_s``,
  ``stack`` (up to 5 ``file:line function`` entries, innermost first) and, when
  the blocking code belongs to a run, that run's keys (task_id, task_name,
  queue, attempt, trace_id, worker_id).
- ``event_loop_unblocked`` (warning): ``blocked_for_s``, the whole time
  without a tick, and the same run keys.

Metrics: ``taskmesh_event_loop_blocked_total`` (once per episode) and
``taskmesh_event_loop_lag_seconds`` (set at each tick: how late it ran).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal

import anyio

from taskmesh.observability.logs import get_logger, run_keys
from taskmesh.observability.metrics import Metrics
from taskmesh.tasks.models import ClaimedTask

log = get_logger("taskmesh.runtime.loop_monitor")

RUN_LOCAL = "_taskmesh_run"
"""Name of the frame-local variable holding the :class:`~taskmesh.tasks.models.ClaimedTask` of a run."""
TICK_SECONDS = 0.1
"""Period of the ticker and of the watcher's checks, seconds."""
STACK_DEPTH = 5
"""Frames of the loop thread's stack named in ``event_loop_blocked``, innermost first."""

__all__ = ["RUN_LOCAL", "STACK_DEPTH", "TICK_SECONDS", "LoopMonitor", "loop_thread_stack"]


@dataclass(frozen=True)
class _Episode:
    """One blocking episode: the stamp of the last tick before it, and the run it belongs to."""

    since: float
    run: dict[str, Any] = field(default_factory=dict)


def loop_thread_stack(thread_id: int, worker_id: str, depth: int = STACK_DEPTH) -> tuple[list[str], dict[str, Any]]:
    """Read another thread's current stack: its top frames and the run it executes, if any.

    :param thread_id: ``threading.get_ident()`` of the thread to read.
    :param worker_id: the instance's worker id, for the run keys.
    :param depth: how many frames to name, innermost first.
    :returns: ``(["file:line function", ...], run keys)``; the keys are empty when
        no frame holds a :data:`RUN_LOCAL`, both are empty when the thread is gone.
    """
    frame: FrameType | None = sys._current_frames().get(thread_id)
    stack: list[str] = []
    run: dict[str, Any] = {}
    while frame is not None and not (run and len(stack) >= depth):
        code = frame.f_code
        if len(stack) < depth:
            stack.append(f"{code.co_filename}:{frame.f_lineno} {code.co_name}")
        # Names first: f_locals builds a dict of the frame's locals, worth it only where the name exists.
        if not run and (RUN_LOCAL in code.co_varnames or RUN_LOCAL in code.co_cellvars):
            task = frame.f_locals.get(RUN_LOCAL)
            if isinstance(task, ClaimedTask):
                run = run_keys(task, worker_id)
        frame = frame.f_back
    return stack, run


class LoopMonitor:
    """Detect a blocked event loop (see module docs).

    Start :meth:`run` as a task on the loop to watch; cancel it to stop. Create a
    new monitor per instance; one monitor watches one loop at a time.

    :param threshold_seconds: time without a tick after which the loop counts as
        blocked, seconds; the setting ``loop_block_threshold_seconds``.
    :param worker_id: the instance's worker id, for the run keys of the log lines.
    :param metrics: the instance's metrics (``None``: count nothing).
    :param tick_seconds: period of the ticker and of the watcher's checks, seconds.
    :param clock: monotonic clock in seconds, read from both threads (tests inject one).
    :raises ValueError: ``threshold_seconds`` is not above two ticks: every pause
        between two ticks would then count as a block.
    """

    def __init__(
        self,
        threshold_seconds: float = 1.0,
        *,
        worker_id: str,
        metrics: Metrics | None = None,
        tick_seconds: float = TICK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not tick_seconds > 0 or not threshold_seconds > 2 * tick_seconds:
            raise ValueError(f"threshold_seconds ({threshold_seconds:g}) must be above two ticks of {tick_seconds:g} s")
        self.threshold_seconds = threshold_seconds
        self.worker_id = worker_id
        self.metrics = metrics
        self.tick_seconds = tick_seconds
        self._clock = clock
        # Written by the loop thread, read by the watcher: single attribute stores, atomic under the GIL.
        self._last_tick = clock()
        self._running = False
        self._loop_thread: int | None = None
        # Watcher thread only.
        self._episode: _Episode | None = None

    async def run(self) -> None:
        """Tick on the loop until cancelled; the watcher thread lives as long as this task.

        :raises RuntimeError: this monitor already runs.
        """
        if self._running:
            raise RuntimeError("this LoopMonitor already runs")
        self._loop_thread = threading.get_ident()
        self._last_tick = self._clock()
        self._running = True
        stop = threading.Event()  # one per run: a watcher of an earlier run cannot be revived by a later one
        watcher = threading.Thread(target=self._watch, args=(stop,), name="taskmesh-loop-monitor", daemon=True)
        watcher.start()
        try:
            while True:
                before = self._clock()
                await anyio.sleep(self.tick_seconds)
                now = self._clock()
                self._last_tick = now
                if self.metrics is not None:
                    self.metrics.event_loop_lag.set(max(0.0, now - before - self.tick_seconds))
        finally:
            # This code runs on the loop, so the loop turns: a last stamp ends an open episode.
            self._last_tick = self._clock()
            self._running = False
            stop.set()  # the watcher makes one last check and ends; not joined, to never block the loop

    def blocked_for(self) -> float:
        """Seconds since the ticker last ran; 0.0 while :meth:`run` is not running. Thread-safe."""
        if not self._running:
            return 0.0
        return max(0.0, self._clock() - self._last_tick)

    def is_blocked(self) -> bool:
        """Whether the loop has gone without a tick for more than the threshold. Thread-safe."""
        return self.blocked_for() > self.threshold_seconds

    def check_once(self) -> Literal["blocked", "unblocked"] | None:
        """One look at the stamp, as the watcher thread makes every tick; tests call it directly.

        :returns: ``"blocked"`` when an episode began with this check (logged and
            counted), ``"unblocked"`` when one ended, else ``None``.
        """
        last = self._last_tick
        episode = self._episode
        if episode is not None:
            if last == episode.since:
                return None
            self._episode = None
            log.warning("event_loop_unblocked", blocked_for_s=round(last - episode.since, 3), **episode.run)
            return "unblocked"
        behind = self._clock() - last
        if not self._running or behind <= self.threshold_seconds:
            return None
        stack: list[str] = []
        run: dict[str, Any] = {}
        if self._loop_thread is not None:
            stack, run = loop_thread_stack(self._loop_thread, self.worker_id)
        self._episode = _Episode(since=last, run=run)
        if self.metrics is not None:
            self.metrics.event_loop_blocked.inc()
        fields = {"blocked_for_s": round(behind, 3), "threshold_s": self.threshold_seconds, "stack": stack, **run}
        try:
            log.warning("event_loop_blocked", **fields)
        except Exception:  # structlog's console renderer wants ``stack`` as text: never lose the line or this thread
            log.warning("event_loop_blocked", **{**fields, "stack": "\n".join(stack)})
        return "blocked"

    def _watch(self, stop: threading.Event) -> None:
        while True:
            stopping = stop.wait(self.tick_seconds)
            self.check_once()
            if stopping:
                return
