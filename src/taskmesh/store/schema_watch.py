"""What one instance saw of statements its database's schema refused: counted, logged, shown on ``/readyz``.

A statement PostgreSQL refuses against its schema (SQLSTATE class 42: an undefined column or table,
an ``ON CONFLICT`` target no unique index matches, an undefined function; see
:attr:`~taskmesh.errors.StoreError.schema_mismatch`) means this instance's release and the
database's schema disagree: an older instance runs after a newer ``taskmesh migrate``, or a newer
one before it. It is not an outage, and not the one request or row at hand either: every caller of
that statement meets it until someone migrates or replaces the instance. So the PostgreSQL store
hands every error it wraps to its :class:`SchemaWatch`, whatever service made the call (the API, the
scheduler's fires, the fetchers' claims, the committer, ...), and the watch counts it
(``taskmesh_store_schema_errors_total``), logs it, and keeps the last one for ``/readyz``.

Log events: ``schema_mismatch`` (error; ``operation``, ``sqlstate``, ``error``: the driver's message,
one line; ``count``), at most one line per operation per interval, with the count it stands for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from taskmesh.errors import StoreError
from taskmesh.observability.log_throttle import LOG_INTERVAL_SECONDS, ThrottledLog
from taskmesh.observability.logs import get_logger
from taskmesh.store.classify import postgres_error

__all__ = ["SCHEMA_WINDOW_SECONDS", "Mismatch", "SchemaWatch"]

SCHEMA_WINDOW_SECONDS = 60.0
"""How long after the last schema mismatch ``/readyz`` stays red, seconds (``schema_error_window_seconds``)."""

log = get_logger("taskmesh.postgres")


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One statement the schema refused.

    :param operation: the named statement (``task_insert_many``).
    :param sqlstate: PostgreSQL's SQLSTATE (``42703``).
    :param detail: the driver's message, one line.
    :param at: when, on :func:`time.monotonic`'s clock (seconds).
    """

    operation: str
    sqlstate: str
    detail: str
    at: float


class SchemaWatch:
    """The schema mismatches of one PostgreSQL store (and of every transaction it opens).

    :param window: seconds after the last mismatch during which :meth:`recent` answers it.
    :param count: called with the operation of each mismatch (the instance's metric); ``None``: none.
    :param log_interval: shortest time between two log lines of one operation, seconds.
    :param clock: the monotonic clock (tests inject one).
    """

    def __init__(
        self,
        window: float = SCHEMA_WINDOW_SECONDS,
        *,
        count: Callable[[str], None] | None = None,
        log_interval: float = LOG_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.count = count
        self.log_interval = log_interval
        self.clock = clock
        self.last: Mismatch | None = None
        self._logs: dict[str, ThrottledLog] = {}

    def error(self, operation: str, exc: BaseException) -> StoreError:
        """Wrap an asyncpg failure of ``operation`` (:func:`~taskmesh.store.classify.postgres_error`),
        recording it when it is a schema mismatch.

        :returns: the error, for the caller to raise.
        """
        error = postgres_error(operation, exc)
        self.record(error)
        return error

    def record(self, error: StoreError) -> None:
        """Count, log (throttled) and keep ``error`` when it is a schema mismatch; ignore any other."""
        if not error.schema_mismatch:
            return
        sqlstate = error.sqlstate or ""
        self.last = Mismatch(error.operation, sqlstate, error.detail, self.clock())
        if self.count is not None:
            self.count(error.operation)
        fields = {"operation": error.operation, "sqlstate": sqlstate, "error": error.detail}
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop to end an interval on: every one is a line
            log.error("schema_mismatch", count=1, **fields)
            return
        throttle = self._logs.get(error.operation)
        if throttle is None:
            throttle = self._logs[error.operation] = ThrottledLog(
                log, "schema_mismatch", self.log_interval, level="error"
            )
        throttle.record(**fields)

    def recent(self) -> Mismatch | None:
        """The last mismatch when it was seen less than ``window`` seconds ago, else ``None``."""
        last = self.last
        return last if last is not None and self.clock() - last.at < self.window else None

    def flush(self) -> None:
        """Log the mismatches counted and not yet logged (the store closes)."""
        for throttle in self._logs.values():
            throttle.flush()
