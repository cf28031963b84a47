"""structlog set-up: JSON lines in production, a readable console on a terminal.

Events are snake_case verbs with fixed keys (``run_finished``,
``store_unavailable``); task log lines carry task_id, task_name, queue,
attempt, trace_id and worker_id (docs/internals/design.md section 6).
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import structlog

_SECRET_PARAMS = frozenset({"password", "sslpassword", "passfile"})

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


current_run: ContextVar[tuple[Any, str] | None] = ContextVar("taskmesh_run", default=None)
"""``(ClaimedTask, worker_id)`` of the run whose handler this task (or thread) executes, if any.

Set by the executor around a handler, one ``set``/``reset`` per run; the keys
are built only when a line is logged, so a run that logs nothing pays nothing."""


def store_address(url: str) -> str:
    """A store's URL as it may be logged: without its user and password, nor a password in its query.

    ``postgresql://app:s3cret@db:5432/jobs?sslmode=require`` gives
    ``postgresql://db:5432/jobs?sslmode=require``; a URL that does not parse gives its scheme only.

    :param url: a ``DATABASE_URL`` or ``REDIS_URL`` (several hosts, as a cluster's or Sentinel's, kept).
    :returns: the URL without credentials.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.partition(":")[0] + "://?"
    hosts = parts.netloc.rpartition("@")[2]
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k.lower() not in _SECRET_PARAMS], safe="/")
    return f"{parts.scheme}://{hosts}{parts.path}" + (f"?{query}" if query else "")


def run_keys(task: Any, worker_id: str) -> dict[str, Any]:
    """The keys every log line about a run carries: task, name, queue, attempt, trace, worker.

    :param task: a :class:`~taskmesh.tasks.models.ClaimedTask`.
    """
    return {
        "task_id": str(task.task_id),
        "task_name": task.name,
        "queue": task.queue,
        "attempt": task.attempt,
        "trace_id": task.trace_id,
        "worker_id": worker_id,
    }


def _add_run_keys(logger: Any, method: str, event: Any) -> Any:
    run = current_run.get()
    if run is not None:
        for key, value in run_keys(*run).items():
            event.setdefault(key, value)
    return event


_configured = False
"""Whether :func:`configure` ran in this process (an instance, the command line)."""


class _Logger:
    """A taskmesh logger: structlog's, as configured, in an instance or the command line; in an
    application's own process (the clients) the standard library logger of the same name.

    So a client inside a script or a web app prints nothing of its own accord: its warnings reach
    the application's ``logging`` set-up (by default, warnings and errors on stderr, nothing
    else), and an application that configured structlog gets them through structlog.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._structlog: Any = structlog.get_logger(name)
        self._stdlib: Any = None

    def __getattr__(self, attr: str) -> Any:
        if _configured or structlog.is_configured():
            return getattr(self._structlog, attr)
        if self._stdlib is None:
            self._stdlib = structlog.wrap_logger(
                logging.getLogger(self._name),
                processors=[_add_run_keys, structlog.processors.KeyValueRenderer(key_order=["event"])],
                wrapper_class=structlog.stdlib.BoundLogger,
            )
        return getattr(self._stdlib, attr)


def get_logger(name: str) -> Any:
    """The logger every taskmesh module uses (see :class:`_Logger`).

    :param name: a dotted name under ``taskmesh`` (``taskmesh.tasks.tasks``), also the stdlib logger's name.
    :returns: an object with structlog's methods (``info``, ``warning``, ``bind``, ...).
    """
    return _Logger(name)


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog for the process (an instance or the command line, never the clients).

    :param level: debug, info, warning or error.
    :param fmt: ``json``, ``console`` or ``auto``: colored console lines when stdout and
        stderr are terminals, JSON lines otherwise (under a process manager, in a container).
    """
    use_console = fmt == "console" or (fmt == "auto" and sys.stdout.isatty() and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    global _configured
    _configured = True
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_run_keys,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # One write per line (print writes the line and its newline apart): the lines of worker
        # processes sharing a stderr never run into each other.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
