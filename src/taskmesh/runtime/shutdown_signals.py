"""Shutdown signals that are heard while the event loop is blocked, and the hard-deadline watchdog.

``loop.add_signal_handler`` (anyio's ``open_signal_receiver``) hands a signal
to the loop, so a loop blocked by an ``async`` handler (``time.sleep(60)``)
never sees SIGTERM. :class:`ShutdownSignals` takes SIGTERM and SIGINT through
two channels that need no loop, both read by a daemon thread
(``taskmesh-shutdown-signals``):

- the *wakeup fd*: CPython's C-level handler writes the signal number to the
  fd given to ``signal.set_wakeup_fd`` the moment the signal arrives, whatever
  the main thread is doing, also inside a C call that never returns to Python;
- a Python-level handler (``signal.signal``), run by the main thread between
  two bytecodes, also during a ``time.sleep`` or a pure-Python loop: it only
  writes one byte to the same pipe (it may interrupt a logger or the loop in
  the middle of their work, so it takes no lock and logs nothing). This one
  still hears signals if other code takes the wakeup fd over.

The thread counts a signal once, whichever channel told it first. First
signal: ``on_first()`` is called on the loop (``loop.call_soon_threadsafe``);
second: ``on_second()`` likewise. The thread also calls ``emergency()`` itself,
and exits the process with status 1 if that returns or raises, when after the
first signal at ``T``:

- the loop is stuck at or after ``T + grace_seconds + margin_seconds``
  (margin 3 s);
- a second signal has come and the loop is stuck: at once when it is stuck
  as the signal comes, else as soon as it is seen stuck;
- ``T + grace_seconds + backstop_seconds`` (30 s) passes, stuck or not: a
  normal shutdown is long over by then.

The loop is stuck when it is blocked (:meth:`LoopProbe.is_blocked`), or when
it waits for a thread that nothing can stop (``threads()``: the ``def``
handlers running in thread mode, which the shutdown waits for). Such a
thread is not a daemon (the interpreter joins it at exit), so only
``os._exit`` in the emergency ends the process while it runs. A loop that
turns and waits for no such thread is left to shut down at its own pace until
the backstop.

uvloop and asyncio differ in one way that matters here: uvloop sets its own
wakeup fd while it runs and relies on it to run Python-level signal handlers
(its C loop otherwise restarts ``epoll_wait`` without returning to Python);
asyncio leaves the wakeup fd unset unless ``add_signal_handler`` is used, and
runs Python handlers when ``select`` returns EINTR. The thread therefore
forwards every byte the wakeup fd brings to the fd it replaced, so the loop's
own signal handling (uvloop's, or asyncio's ``add_signal_handler``) goes on.

Only one :class:`ShutdownSignals` may be active in a process; on exit it puts
back the handlers and the wakeup fd it found (``exits.terminate_early``, the
asyncio runner's SIGINT handler, uvloop's fd). Reads and writes no store:
handing runs back in an emergency is the caller's ``emergency``.

Log events (logger ``taskmesh.shutdown``), written by the thread, so they
reach stderr while the loop is blocked: ``shutdown_requested`` (info,
``signal``), ``shutdown_forced`` (warning, ``signal``), ``shutdown_emergency``
(error, ``reason``: deadline, second_signal or backstop, ``since_request_s``,
``blocked_for_s``, ``handler_threads``), ``shutdown_emergency_failed`` (error, ``error``: the
emergency callback raised) and, from the default emergency,
``shutdown_emergency_exit`` (error, ``exit_code``). No metrics.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Literal, Protocol, Self

from taskmesh.observability.logs import get_logger

log = get_logger("taskmesh.shutdown")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that stop the instance."""
MARGIN_SECONDS = 3.0
"""Past the grace period, how long a blocked loop is given before the emergency exit, seconds."""
BACKSTOP_SECONDS = 30.0
"""Past the grace period, when the emergency exit comes whatever the loop does, seconds."""
CHECK_SECONDS = 0.1
"""How often the thread looks at the deadlines, seconds."""
EMERGENCY_EXIT_CODE = 1
"""Exit status of the default emergency."""

# Bytes on the pipe besides the signal numbers (1..64) that the wakeup fd writes.
_REQUEST = 0x00  # request_stop()
_MARK = 0x80  # our Python-level handler ran: 0x80 | signum
_QUIT = 0xFF  # the context is left: the thread ends

Reason = Literal["deadline", "second_signal", "backstop"]

__all__ = [
    "BACKSTOP_SECONDS",
    "HANDLED_SIGNALS",
    "MARGIN_SECONDS",
    "LoopProbe",
    "ShutdownSignals",
    "exit_now",
]

_active: ShutdownSignals | None = None


class LoopProbe(Protocol):
    """What the watchdog needs to know about the loop (:class:`~taskmesh.runtime.loop_monitor.LoopMonitor` fits)."""

    def is_blocked(self) -> bool:
        """Whether the loop has gone without turning for longer than its threshold; called from another thread."""
        ...

    def blocked_for(self) -> float:
        """Seconds since the loop last turned; called from another thread."""
        ...


def request_stop() -> bool:
    """Act as if one SIGTERM had reached this process's active :class:`ShutdownSignals`. Any thread.

    :returns: ``False`` when none is active (the instance has not started, or has ended).
    """
    active = _active
    if active is None:
        return False
    try:
        active.request_stop()
    except RuntimeError:  # it ended in the meantime
        return False
    return True


def exit_now() -> None:
    """The default emergency: log ``shutdown_emergency_exit`` and end the process with status 1.

    ``os._exit``: no ``finally`` block, ``atexit`` hook or thread join can hold it,
    which is the point when the loop is deaf.
    """
    log.error("shutdown_emergency_exit", exit_code=EMERGENCY_EXIT_CODE)
    os._exit(EMERGENCY_EXIT_CODE)


class ShutdownSignals:
    """SIGTERM/SIGINT handling and hard-deadline watchdog of one instance (see module docs).

    Enter it in the main thread, inside the running loop, before the task group
    of the instance; leave it after that group has ended::

        with ShutdownSignals(on_first=stop.set, on_second=force.set, grace_seconds=30,
                             monitor=monitor, emergency=hand_back_and_exit) as sig:
            ...

    :param on_first: called on the loop at the first signal (start the graceful shutdown).
    :param on_second: called on the loop at the second (end the grace period now).
    :param grace_seconds: the instance's shutdown grace period, seconds.
    :param monitor: tells whether the loop is blocked, from the watchdog thread.
    :param threads: how many threads that cannot be stopped the loop waits for (thread-mode
        ``def`` handlers), read from the watchdog thread; more than 0 counts as a stuck loop.
        Default: none.
    :param emergency: called in the watchdog thread when the loop cannot stop by
        itself; it should hand back what it can with its own bounded I/O and end the
        process (``os._exit``). If it returns or raises, the process exits with status 1
        all the same. Default :func:`exit_now`.
    :param margin_seconds: past the grace period, time a blocked loop is given, seconds.
    :param backstop_seconds: past the grace period, time after which the emergency
        comes whatever the loop does, seconds.
    :param clock: monotonic clock, seconds.
    :raises ValueError: a negative grace or margin, or a backstop not beyond the margin.
    """

    def __init__(
        self,
        *,
        on_first: Callable[[], object],
        on_second: Callable[[], object],
        grace_seconds: float,
        monitor: LoopProbe,
        threads: Callable[[], int] = lambda: 0,
        emergency: Callable[[], object] = exit_now,
        margin_seconds: float = MARGIN_SECONDS,
        backstop_seconds: float = BACKSTOP_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if grace_seconds < 0 or margin_seconds < 0 or backstop_seconds <= margin_seconds:
            raise ValueError(
                f"need grace >= 0, margin >= 0 and backstop > margin; got grace {grace_seconds:g} s, "
                f"margin {margin_seconds:g} s, backstop {backstop_seconds:g} s"
            )
        self._on_first = on_first
        self._on_second = on_second
        self._emergency = emergency
        self._monitor = monitor
        self._threads = threads
        self.grace_seconds = grace_seconds
        self.margin_seconds = margin_seconds
        self.backstop_seconds = backstop_seconds
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._read_fd = self._write_fd = -1
        self._old_wakeup_fd = -1
        self._previous: dict[signal.Signals, Any] = {}
        # Written by the thread only; read from anywhere (single attribute stores).
        self.requested_at: float | None = None
        """``time.monotonic()`` of the first signal (or :meth:`request_stop`); ``None`` before."""
        self.forced = False
        """Whether a second signal came."""
        self._emergency_started = False
        # Thread only: what each channel has told.
        self._woken = self._marked = self._requests = self._acted = 0
        self._heard = ""  # name of the last signal counted, or request_stop
        self._quit = False

    # -- the main thread ------------------------------------------------------

    def __enter__(self) -> Self:
        """Install the handlers and the wakeup fd, start the thread.

        :raises RuntimeError: not in the main thread, no running event loop, or
            another :class:`ShutdownSignals` is active in this process.
        """
        global _active
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("ShutdownSignals must be entered in the main thread (signal handlers live there)")
        self._loop = asyncio.get_running_loop()
        if _active is not None:
            raise RuntimeError("another ShutdownSignals is active in this process")
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # set_wakeup_fd requires it; a handler must never block
        _active = self
        try:
            self._thread = threading.Thread(target=self._watch, name="taskmesh-shutdown-signals", daemon=True)
            self._thread.start()
            self._old_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
            for signum in HANDLED_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Put back the handlers and the wakeup fd found on entry; stop the thread.

        While an emergency is under way, waits for it (it ends the process).
        """
        global _active
        try:
            ours = signal.set_wakeup_fd(self._old_wakeup_fd, warn_on_full_buffer=False)
            if ours != self._write_fd:  # someone took the slot after us: it stays theirs
                signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
            for signum, previous in self._previous.items():
                # None: a handler set outside Python, which cannot be put back; the default is closest.
                signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        finally:
            self._send(_QUIT)
            if self._thread is not None:
                self._thread.join(None if self._emergency_started else 1.0)
            os.close(self._read_fd)
            os.close(self._write_fd)
            self._previous.clear()
            _active = None

    def request_stop(self) -> None:
        """Act as if one SIGTERM had arrived (tests, or an operator's command). Any thread.

        :raises RuntimeError: the context is not entered.
        """
        if _active is not self:
            raise RuntimeError("request_stop() outside the ShutdownSignals context")
        self._send(_REQUEST)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # The main thread runs this between two bytecodes, maybe inside the loop's bookkeeping or
        # inside a logger holding its lock: one non-blocking write, nothing that takes a lock.
        self._send(_MARK | signum)

    def _send(self, byte: int) -> None:
        try:
            os.write(self._write_fd, bytes((byte,)))
        except OSError:  # a full pipe (the thread is far behind): the wakeup byte has told it already
            pass

    # -- the thread -----------------------------------------------------------

    def _watch(self) -> None:
        while not self._quit:
            readable, _, _ = select.select([self._read_fd], [], [], CHECK_SECONDS)
            if readable:
                self._take(os.read(self._read_fd, 4096))
            self._check_deadlines()

    def _take(self, data: bytes) -> None:
        """Count what the pipe brought, forward the wakeup bytes, act on new signals."""
        forward = bytearray()
        for byte in data:
            if byte == _QUIT:
                self._quit = True
            elif byte == _REQUEST:
                self._requests += 1
                self._heard = "request_stop"
            elif byte & _MARK:
                if (byte & ~_MARK) in HANDLED_SIGNALS:
                    self._marked += 1
                    self._heard = signal.Signals(byte & ~_MARK).name
            else:
                forward.append(byte)
                if byte in HANDLED_SIGNALS:
                    self._woken += 1
                    self._heard = signal.Signals(byte).name
        if forward and self._old_wakeup_fd >= 0:
            try:
                os.write(self._old_wakeup_fd, forward)
            except OSError:  # the loop's pipe full: it has signals to read already
                pass
        # Each signal reaches both channels unless the wakeup fd was taken over or the Python
        # handler has not run yet (or ran once for two signals): the larger count is the truth.
        received = max(self._woken, self._marked) + self._requests
        while self._acted < min(received, 2):
            self._acted += 1
            if self._acted == 1:
                self.requested_at = self._clock()
                log.info("shutdown_requested", signal=self._heard)
                self._call_on_loop(self._on_first)
            else:
                self.forced = True
                log.warning("shutdown_forced", signal=self._heard)
                self._call_on_loop(self._on_second)

    def _call_on_loop(self, callback: Callable[[], object]) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop is closed: nothing is left to stop
            pass

    def _check_deadlines(self) -> None:
        """Call the emergency when the loop cannot stop by itself (see module docs)."""
        if self.requested_at is None or self._emergency_started:
            return
        past_grace = self._clock() - self.requested_at - self.grace_seconds
        reason: Reason | None = None
        if past_grace >= self.backstop_seconds:
            reason = "backstop"
        elif self._monitor.is_blocked() or self._threads() > 0:
            if self.forced:
                reason = "second_signal"
            elif past_grace >= self.margin_seconds:
                reason = "deadline"
        if reason is not None:
            self._emergency_exit(reason)

    def _emergency_exit(self, reason: Reason) -> None:
        self._emergency_started = True
        assert self.requested_at is not None
        log.error(
            "shutdown_emergency",
            reason=reason,
            since_request_s=round(self._clock() - self.requested_at, 3),
            blocked_for_s=round(self._monitor.blocked_for(), 3),
            handler_threads=self._threads(),
        )
        try:
            self._emergency()
        except Exception as exc:  # the process ends below either way; say why the hand-back failed
            log.error("shutdown_emergency_failed", error=f"{type(exc).__name__}: {exc}")
        # emergency must not return: the loop is deaf and nothing else would end the process.
        os._exit(EMERGENCY_EXIT_CODE)
