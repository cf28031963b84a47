"""Log lines a flood would repeat, written at most once per interval with the count they stand for.

A refusal that a client can repeat thousands of times a second (a connection over a cap, a
request while Redis is down) must not write a line each time: :class:`ThrottledLog` writes the
first occurrence after a quiet interval at once, counts the later ones, and writes them as one
line (``count``, and the fields of the last one) when the interval ends, so a flood makes one
line per interval and no count is lost when it stops.

Runs on the event loop of its caller (asyncio or uvloop): the end of an interval is a timer.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["LOG_INTERVAL_SECONDS", "ThrottledLog"]

LOG_INTERVAL_SECONDS = 10.0
"""Shortest time between two lines of one throttled event, seconds."""


class ThrottledLog:
    """One event, logged at most once per ``interval`` with the count it stands for.

    :param logger: where the line goes: a :func:`taskmesh.observability.logs.get_logger` logger.
    :param event: the event's name (``http_connections_capped``).
    :param interval: seconds between two lines of the event.
    :param level: the lines' level (the name of the logger's method: ``warning``, ``error``).
    """

    def __init__(
        self, logger: Any, event: str, interval: float = LOG_INTERVAL_SECONDS, *, level: str = "warning"
    ) -> None:
        self.logger = logger
        self.event = event
        self.interval = interval
        self.level = level
        self.pending = 0
        self.fields: dict[str, Any] = {}
        self.quiet_from = float("-inf")
        self.timer: asyncio.TimerHandle | None = None

    def record(self, **fields: Any) -> None:
        """One occurrence with its ``fields``: logged now after a quiet interval, else counted.

        Must be called on a running event loop.
        """
        loop = asyncio.get_running_loop()
        self.pending += 1
        self.fields = fields
        if loop.time() >= self.quiet_from:
            self.flush(loop)
        elif self.timer is None:
            self.timer = loop.call_at(self.quiet_from, self.flush, loop)

    def flush(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Log what is counted now (at the end of an interval, or when its owner stops).

        :param loop: the running loop, to start a new interval; ``None`` (the owner stops): none.
        """
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.pending:
            getattr(self.logger, self.level)(self.event, count=self.pending, **self.fields)
            self.pending = 0
            if loop is not None:
                self.quiet_from = loop.time() + self.interval
