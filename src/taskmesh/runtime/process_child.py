"""Child side of the handler process pool: the entry point and call loop of one handler process.

A handler process is started by :class:`taskmesh.runtime.process_pool.ProcessPool`
(spawn start method) with :func:`child_main`. It leaves the instance's process
group and ignores SIGINT (a group-wide signal reaches only the instance, which
decides), keeps
SIGTERM's default action (the pool stops it that way; restored after each
call, should a handler have changed it), asks Linux to SIGKILL it
when its parent dies (``PR_SET_PDEATHSIG``) and exits at once if that parent is
already gone. It configures structlog like the parent, imports the ``preload``
modules, says it is ready, then runs one :class:`Call` at a time: import the
handler by module and qualified name, decode the payload into the handler's
declared type, call it (with ``ctx=`` when it wants one) with the run's log keys
bound, and send back one :class:`ChildOutcome` per call. It exits when the pipe
to its parent closes.

When things fail: nothing a handler returns or raises ends the process. An
exception becomes ``raised`` (one-line error, traceback bounded to 16 KiB);
``NonRetryableError``, a payload that does not fit the handler's type and a
return value orjson cannot serialise (an unsupported type, a lone surrogate)
are not retryable; ``Retry`` carries its delay. Error and traceback text is
made storable (lone surrogates and NUL escaped).

Log events: ``handler_module_preload_failed`` (module, error) and
``handler_process_pdeathsig_failed`` (errno), at warning. The handler's own
lines carry task_id, task_name, queue, attempt, trace_id and worker_id.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, Literal

import orjson

from taskmesh.errors import NonRetryableError, PayloadDecodeError, RateLimited, Retry
from taskmesh.observability.logs import configure, current_run, get_logger
from taskmesh.tasks.models import ClaimedTask, TaskContext
from taskmesh.tasks.registry import Handler, make_handler

log = get_logger("taskmesh.runtime.process_child")

MAX_ERROR_CHARS = 2000
"""Longest ``ChildOutcome.error``, characters (the executor's limit too)."""

MAX_TRACEBACK_BYTES = 16 * 1024
"""Longest ``ChildOutcome.traceback``, UTF-8 bytes; the end (innermost frames) is kept."""

READY = "ready"
"""What a child sends once, after start-up and preloading, before its first call."""

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How one call in a handler process ended.

    :param kind: ``returned``, ``raised`` (the handler raised, or its payload or
        result did not fit), ``timed_out`` (stopped past its timeout) or ``died``
        (the process ended during the call: a crash, a signal, ``os._exit``).
    :param result_json: for ``returned``, the return value as JSON text (orjson).
    :param error: one line for the other kinds, at most 2,000 characters, e.g.
        ``"ValueError: bad"``, ``"timed out after 2 s"``,
        ``"handler process died (signal SIGSEGV)"``.
    :param traceback: for ``raised`` by the handler, the formatted traceback,
        at most 16 KiB, its end kept.
    :param retryable: ``False`` for ``NonRetryableError``, a payload the
        handler's type cannot decode, a result that is not JSON-serialisable.
    :param retry_delay: seconds, from ``taskmesh.Retry(delay_seconds=...)``.
    :param rate_limited: seconds, from ``taskmesh.RateLimited(retry_after=...)``: not a failure.
    :param duration_seconds: handler wall time in the child, or until it was stopped.
    """

    kind: Literal["returned", "raised", "timed_out", "died"]
    result_json: str | None = None
    error: str | None = None
    traceback: str | None = None
    retryable: bool = True
    retry_delay: float | None = None
    duration_seconds: float = 0.0
    rate_limited: float | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """One handler call, sent by the pool to a child.

    :param module: the handler's module, imported by name in the child.
    :param qualname: the handler's qualified name within ``module``.
    :param run: the claimed task, bound to the handler's log lines (its payload
        may be dropped: only the keys of :func:`taskmesh.observability.logs.run_keys` are read).
    """

    module: str
    qualname: str
    payload: Any
    ctx: TaskContext | None
    run: ClaimedTask | None
    worker_id: str

    def light(self) -> Call:
        """This call without the payload's copy inside ``run``: the payload is pickled once, not twice."""
        return self if self.run is None else replace(self, run=replace(self.run, payload=None))


def child_main(
    conn: Connection[ChildOutcome | str, Call],
    parent_pid: int,
    log_level: str,
    log_format: str,
    preload: Sequence[str],
) -> None:
    """Entry point of a handler process: set up, say ready, serve calls until the pipe closes.

    :param conn: the child's end of the pool's pipe: receives :class:`Call`,
        sends :data:`READY` once then one :class:`ChildOutcome` per call.
    :param parent_pid: the pool's process; the child exits at once when it is not its parent.
    :param log_level: as :func:`taskmesh.observability.logs.configure`.
    :param log_format: as :func:`taskmesh.observability.logs.configure`.
    :param preload: modules to import before the first call.
    """
    # Dispositions and masks survive exec: make sure the pool's SIGTERM does stop us.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _reset_signals()
    configure(log_level, log_format)
    _die_with_parent(parent_pid)
    # A process group of its own: a group-wide signal (Supervisor's stopasgroup, a terminal's
    # Ctrl-C) reaches only the instance, which drains and then stops this process itself; if
    # the instance dies, PDEATHSIG ends this one.
    os.setpgrp()
    # A handler's own subprocesses must not hold the pipe open: the pool reads EOF as "died".
    os.set_inheritable(conn.fileno(), False)
    for module in preload:
        _preload(module)
    conn.send(READY)
    serve(conn)


def serve(conn: Connection[ChildOutcome | str, Call]) -> None:
    """Run calls received on ``conn`` one at a time until it closes (the pool closed it or died)."""
    while True:
        try:
            call = conn.recv()
        except EOFError:
            return
        outcome = execute(call)
        _reset_signals()  # a handler that ignored SIGTERM for its call must not leave us deaf to it
        try:
            conn.send(outcome)
        except OSError:  # the parent is gone; PDEATHSIG is on its way
            return


def _reset_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("handler_process_pdeathsig_failed", errno=ctypes.get_errno())
    # The parent may have died before prctl took effect; no signal would come then.
    if os.getppid() != parent_pid:
        os._exit(1)


def _preload(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # module code may raise anything; the run that needs it reports it
        log.warning("handler_module_preload_failed", module=module, error=describe(exc))


_handlers: dict[tuple[str, str], Handler] = {}


def _handler(module: str, qualname: str) -> Handler:
    key = (module, qualname)
    handler = _handlers.get(key)
    if handler is None:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        handler = make_handler("child", target)
        if handler.is_async:
            raise NonRetryableError(f"{module}.{qualname} is async: it runs on the event loop, not in a process")
        _handlers[key] = handler
    return handler


def _invoke(call: Call) -> Any:
    handler = _handler(call.module, call.qualname)
    payload = handler.decode(call.payload)
    kwargs: dict[str, Any] = {"ctx": call.ctx} if handler.wants_ctx else {}
    token = current_run.set((call.run, call.worker_id)) if call.run is not None else None
    try:
        return handler.func(payload, **kwargs)
    finally:
        if token is not None:
            current_run.reset(token)


def execute(call: Call) -> ChildOutcome:
    """Run one call's handler in this process and describe how it ended.

    :returns: ``returned`` with the JSON text of the result, else ``raised``
        (see :class:`ChildOutcome` for which are retryable).

    Never raises: whatever the handler raises (``SystemExit`` included) is the outcome.
    """
    started = time.perf_counter()
    try:
        value = _invoke(call)
    except PayloadDecodeError as exc:
        return _failed(f"payload does not fit the handler: {exc}", started, retryable=False)
    except RateLimited as exc:
        return replace(_raised(exc, started), traceback=None, rate_limited=exc.retry_after)
    except NonRetryableError as exc:
        return _raised(exc, started, retryable=False)
    except Retry as exc:
        return _raised(exc, started, retry_delay=_seconds(exc.delay_seconds))
    except BaseException as exc:  # a handler's failure, whatever it is, is an outcome, never the end of the child
        return _raised(exc, started)
    duration = time.perf_counter() - started
    try:
        text = orjson.dumps(value).decode()
    except Exception as exc:  # orjson.JSONEncodeError: an unsupported type, a lone surrogate, an int past 64 bits
        return _failed(f"handler result is not JSON-serialisable: {describe_message(exc)}", started, retryable=False)
    return ChildOutcome("returned", result_json=text, duration_seconds=duration)


def _failed(error: str, started: float, *, retryable: bool) -> ChildOutcome:
    return ChildOutcome(
        "raised",
        error=_storable(error)[:MAX_ERROR_CHARS],
        retryable=retryable,
        duration_seconds=time.perf_counter() - started,
    )


def _raised(
    exc: BaseException, started: float, *, retryable: bool = True, retry_delay: float | None = None
) -> ChildOutcome:
    return ChildOutcome(
        "raised",
        error=describe(exc),
        traceback=bounded_traceback(exc),
        retryable=retryable,
        retry_delay=retry_delay,
        duration_seconds=time.perf_counter() - started,
    )


def _seconds(value: object) -> float | None:
    try:
        return None if value is None else float(value)  # type: ignore[arg-type]  # any object a handler passed
    except (TypeError, ValueError):
        return None


def describe_message(exc: BaseException) -> str:
    """The first line of ``str(exc)``, ``"<exception str() failed>"`` when that raises.

    A message cut to its first line ends with `` …``; the traceback has the rest.
    """
    try:
        message = str(exc)
    except BaseException:  # a broken __str__ must not end the child
        return "<exception str() failed>"
    lines = message.strip().splitlines()
    if not lines:
        return ""
    return lines[0] + (" …" if len(lines) > 1 else "")


def describe(exc: BaseException) -> str:
    """``"ValueError: bad"``: one storable line, at most :data:`MAX_ERROR_CHARS` characters."""
    message = describe_message(exc)
    text = _storable(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 2] + " …"


def bounded_traceback(exc: BaseException) -> str:
    """The formatted traceback of ``exc``, at most :data:`MAX_TRACEBACK_BYTES` UTF-8 bytes.

    It starts at the first frame outside this module (the handler's, or the
    import of its module). A longer one keeps its end (the innermost frames and
    the message) from a line boundary, after a line saying how many bytes were cut.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    try:
        text = _storable("".join(traceback.format_exception(type(exc), exc, tb)))
    except BaseException:  # formatting calls the exception's own code (__str__, __notes__)
        return "<traceback could not be formatted>"
    data = text.encode()
    if len(data) <= MAX_TRACEBACK_BYTES:
        return text
    tail = data[-(MAX_TRACEBACK_BYTES - 64) :]
    tail = tail[tail.find(b"\n") + 1 :]
    return f"[{len(data) - len(tail)} earlier bytes of the traceback cut]\n" + tail.decode("utf-8", "ignore")


def _storable(text: str) -> str:
    # Lone surrogates cannot be encoded and PostgreSQL text cannot hold NUL: escape both.
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
