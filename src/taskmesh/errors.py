"""Exceptions of taskmesh: one root, one class per failure mode.

Handler outcomes (``Retry``, ``NonRetryableError``) are raised by task handlers
to steer what happens to a run; the rest are raised by taskmesh itself.
"""

from __future__ import annotations


class TaskmeshError(Exception):
    """Root of every exception taskmesh raises on purpose."""


class ConfigError(TaskmeshError):
    """The configuration is invalid or incomplete; the message names the key.

    The CLI turns it into exit status 2 (see ``cli.py``).
    """


class InvalidTaskError(TaskmeshError, ValueError):
    """A task to enqueue failed validation; nothing was written.

    :param field: the offending field (``priority``, ``payload``, ...).
    :param message: what is wrong with it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TaskNotFoundError(TaskmeshError, LookupError):
    """No task has the given id."""


class StoreUnavailableError(TaskmeshError):
    """PostgreSQL or Redis did not answer; ``store`` says which."""

    def __init__(self, store: str, detail: str = "") -> None:
        super().__init__(f"{store} is unavailable" + (f": {detail}" if detail else ""))
        self.store = store


class NonRetryableError(TaskmeshError):
    """Raised by a handler: the run fails and the task goes straight to ``failed``.

    Use it for errors that another attempt cannot fix (bad input, a missing
    record); design.md section 3 lists it among the non-retryable outcomes.
    """


class Retry(TaskmeshError):
    """Raised by a handler: the run fails and the task is retried.

    :param delay_seconds: wait this long (seconds) before the next attempt
        instead of the backoff policy's value; ``None`` keeps the policy.

    The retry still counts against ``max_retries``.
    """

    def __init__(self, reason: str = "retry requested", delay_seconds: float | None = None) -> None:
        super().__init__(reason)
        self.delay_seconds = delay_seconds


class EmbeddedServerError(TaskmeshError):
    """An embedded server of the dev profile (``taskmesh.dev``) could not be started again.

    The message names the server and what failed (pg_ctl's exit, Valkey not
    answering PING in time); the server's own log says more.
    """
