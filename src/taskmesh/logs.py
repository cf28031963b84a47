"""structlog set-up: JSON lines in production, a readable console on a terminal.

Events are snake_case verbs with fixed keys (``run_finished``,
``store_unavailable``); task log lines carry task_id, task_name, queue,
attempt, trace_id and worker_id (design.md section 6).
"""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog for the process.

    :param level: debug, info, warning or error.
    :param fmt: ``json``, ``console`` or ``auto``: colored console lines when stdout and
        stderr are terminals, JSON lines otherwise (under a process manager, in a container).
    """
    use_console = fmt == "console" or (fmt == "auto" and sys.stdout.isatty() and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
