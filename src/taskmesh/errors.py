"""Exceptions of taskmesh: one root, one class per failure mode (imports nothing of taskmesh).

Handler outcomes (``Retry``, ``NonRetryableError``) are raised by task handlers
to steer what happens to a run; the rest are raised by taskmesh itself. Each
class's docstring says what it means and who handles it: the API maps them to
HTTP statuses in one table (``taskmesh.api.errors``), services decide per
:class:`StoreError` whether to back off (transient) or to fail the one thing
at hand (not transient).
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

    :param field: the offending field (``priority``, ``payload.customer.id``, ...).
    :param message: what is wrong with it.
    :param errors: every ``(field, message)`` found, the first one being ``field``'s.
    """

    def __init__(self, field: str, message: str, errors: list[tuple[str, str]] | None = None) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.errors = errors or [(field, message)]

    def under(self, prefix: str) -> InvalidTaskError:
        """The same refusal with every field under ``prefix`` (``tasks[3].`` + ``payload.id``)."""
        errors = [(prefix + f, m) for f, m in self.errors]
        return InvalidTaskError(errors[0][0], errors[0][1], errors)


class TaskNotFoundError(TaskmeshError, LookupError):
    """No task has the given id.

    :param task_id: the id asked for, as text.
    :param detail: the message, when it is not ``no task has id <task_id>``.
    """

    def __init__(self, task_id: str, detail: str | None = None) -> None:
        super().__init__(detail or f"no task has id {task_id}")
        self.task_id = task_id


class WorkflowNotFoundError(TaskmeshError, LookupError):
    """No workflow has the given id (or it is another tenant's, which a tenant-bound key may not know).

    :param workflow_id: the id asked for, as text.
    """

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"no workflow has id {workflow_id}")
        self.workflow_id = workflow_id


class WorkflowStateError(TaskmeshError):
    """The workflow is in a state the operation does not apply to (retry a running one, cancel a completed one).

    :param workflow_id: the workflow's id, as text.
    :param status: the status it has.
    :param hint: what to do instead, for the message.
    """

    def __init__(self, workflow_id: str, status: str, hint: str) -> None:
        super().__init__(f"workflow {workflow_id} is {status}; {hint}")
        self.workflow_id = workflow_id
        self.status = status


class TaskFinishedError(TaskmeshError):
    """The task already finished (completed, failed or cancelled): the operation does not apply.

    :param task_id: the task's id, as text.
    :param status: the status it has.
    :param action: what was asked (``cancel``), for the message.
    """

    def __init__(self, task_id: str, status: str, action: str = "cancel") -> None:
        super().__init__(f"task {task_id} is {status}; there is nothing to {action}")
        self.task_id = task_id
        self.status = status
        self.action = action


class TaskStateError(TaskmeshError):
    """The task is in a state the operation does not apply to (retry a running task, delete a queued one).

    :param task_id: the task's id, as text.
    :param status: the status it has.
    :param action: what was asked (``retry``, ``delete``).
    :param hint: what to do instead, for the message.
    """

    def __init__(self, task_id: str, status: str, action: str, hint: str) -> None:
        super().__init__(f"task {task_id} is {status}; {hint}")
        self.task_id = task_id
        self.status = status
        self.action = action


class TaskFailedError(TaskmeshError):
    """A task waited for ended failed (dead-lettered): :attr:`error` is its latest run's error.

    :param task_id: the task's id, as text.
    :param error: the latest run's error text (``None`` when it has none).
    """

    def __init__(self, task_id: str, error: str | None) -> None:
        super().__init__(f"task {task_id} failed: {error or 'no error recorded'}")
        self.task_id = task_id
        self.error = error


class TaskCancelledError(TaskmeshError):
    """A task waited for was cancelled.

    :param task_id: the task's id, as text.
    """

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id} was cancelled")
        self.task_id = task_id


class WaitTimeoutError(TaskmeshError, TimeoutError):
    """A task waited for did not finish in time.

    :param task_id: the task's id, as text.
    :param seconds: how long was waited.
    :param status: the task's status at the deadline.
    """

    def __init__(self, task_id: str, seconds: float, status: str) -> None:
        super().__init__(f"task {task_id} is still {status} after {seconds:g} s")
        self.task_id = task_id
        self.seconds = seconds
        self.status = status


class ScheduleNotFoundError(TaskmeshError, LookupError):
    """No schedule has this name (in the ``schedules`` table)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"schedule {name!r} not found")
        self.name = name


class LimitNotFoundError(TaskmeshError, LookupError):
    """No limit of this name is in force (configured or set at run time), or none was set at run time.

    :param name: the limit asked for.
    :param detail: the message, when it is not ``no limit is named <name>``.
    """

    def __init__(self, name: str, detail: str | None = None) -> None:
        super().__init__(detail or f"no limit is named {name!r}")
        self.name = name


class PayloadDecodeError(TaskmeshError):
    """The payload does not fit the handler's declared type; the run is not retried."""


class CronSpecError(TaskmeshError, ValueError):
    """A cron expression or a time zone is invalid; the message says what is wrong."""


class AuthenticationError(TaskmeshError):
    """A request without a usable API key: none given, not of the form ``tmk_<id>_<secret>``,
    unknown, wrong, revoked or expired (the API answers 401; the message never holds the secret).

    :param reason: why, in a word that names no key (``no_key``, ``malformed``, ``unknown_key``,
        ``revoked``, ``expired``, ``session_over``, ``session_open``): repeated refusals from one
        address for one reason are counted together in the audit log.
    """

    def __init__(self, message: str, reason: str = "unknown_key") -> None:
        super().__init__(message)
        self.reason = reason


class PermissionDeniedError(TaskmeshError):
    """A valid key without the scope an action needs (the API answers 403 naming the scope).

    :param scope: the scope the action needs.
    """

    def __init__(self, scope: str, detail: str | None = None) -> None:
        super().__init__(detail or f"this key lacks the scope {scope!r}")
        self.scope = scope


class BeyondReachError(TaskmeshError):
    """A request names a tenant or queue beyond its key's reach (the API answers 403 naming the field).

    :param field: the request's field (``tenant_id``, ``queue_name``, ``queues``, ``scopes``).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ForgedRequestError(TaskmeshError):
    """A change sent with a console session's cookie but not by the console's own page: the
    ``X-CSRF-Token`` is missing or wrong, or the browser says another site sent it (403 naming the field).

    :param field: ``X-CSRF-Token``, ``Origin`` or ``Sec-Fetch-Site``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class QuotaExceededError(TaskmeshError):
    """A tenant's quota refuses a create (the API answers 429, or 413 for payload bytes, naming the quota).

    :param quota: ``max_queued``, ``max_payload_bytes`` or ``enqueue_per_second``.
    :param retry_after: seconds until a retry may succeed (``None``: not until the tenant's tasks finish).
    """

    def __init__(self, tenant_id: str, quota: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.tenant_id = tenant_id
        self.quota = quota
        self.retry_after = retry_after


class RateLimitedError(TaskmeshError):
    """An API key spent its budget of a class of requests (the API answers 429 with ``Retry-After``).

    :param policy_name: the class (``read``, ``write``, ``admin``).
    :param policy: its IETF ``RateLimit-Policy`` item.
    :param retry_after: seconds until one more request is allowed.
    :param reset: seconds until the whole burst is available again.
    """

    def __init__(self, message: str, policy_name: str, policy: str, retry_after: float, reset: float) -> None:
        super().__init__(message)
        self.policy_name = policy_name
        self.policy = policy
        self.retry_after = retry_after
        self.reset = reset


class NotReadyError(TaskmeshError):
    """The instance is still connecting to its stores (the API answers 503)."""


class BadJsonError(TaskmeshError):
    """A request body is not valid JSON (the API answers 400); the message is the parser's."""


class StoreError(TaskmeshError):
    """A call to PostgreSQL or Redis failed. Raised only by the store wrappers (``taskmesh.store``).

    :param store: ``postgres`` or ``redis``.
    :param operation: the named query or command that failed (``task_claim_many``).
    :param transient: ``True`` for an outage (connection lost, timeout, server
        shutting down, failover, serialization failure): back off and retry, and
        ``/readyz`` names the store. ``False`` for an error that the same call
        would meet again (a data, constraint or syntax error, a reply that is not
        what taskmesh wrote): fail the one request, result or tick at hand with a
        clear message, and carry on.
    :param detail: the driver's message, one line.
    :param sqlstate: PostgreSQL's SQLSTATE of the error (``42703``), ``None`` when it sent none.
    :param constraint: the constraint or unique index PostgreSQL named (a unique violation), else ``None``.
    """

    def __init__(
        self,
        store: str,
        operation: str,
        *,
        transient: bool,
        detail: str,
        sqlstate: str | None = None,
        constraint: str | None = None,
    ) -> None:
        kind = "unavailable" if transient else "error"
        super().__init__(f"{store} {kind} in {operation}: {detail}")
        self.store = store
        self.operation = operation
        self.transient = transient
        self.detail = detail
        self.sqlstate = sqlstate
        self.constraint = constraint

    @property
    def schema_mismatch(self) -> bool:
        """Whether PostgreSQL refused the statement against its schema (SQLSTATE class 42: an undefined
        column, table or function, an ``ON CONFLICT`` target no unique index matches, ...).

        What an instance meets when its release and the database's schema disagree (an older
        instance after a newer ``taskmesh migrate``, or a newer one before it): not an outage, and
        not the one request or row at hand either. A missing privilege (``42501``) is a grant to
        give, not a schema to change, and is not counted.
        """
        state = self.sqlstate or ""
        return self.store == "postgres" and state.startswith("42") and state != "42501"


class MigrationError(TaskmeshError):
    """A migration failed with an error that retrying cannot fix; the instance does not start.

    :param version: the migration's number.
    :param name: its name (``0004_schedules.sql`` is version 4, name ``schedules``).
    :param detail: PostgreSQL's message.
    """

    def __init__(self, version: int, name: str, detail: str) -> None:
        super().__init__(f"migration {version:04d}_{name} failed: {detail}")
        self.version = version
        self.name = name
        self.detail = detail


class ServiceFailedError(TaskmeshError):
    """A critical service crashed more often than its restart budget allows; the instance stopped.

    The CLI turns it into exit status 1 after the graceful shutdown.
    """

    def __init__(self, service: str, restarts: int) -> None:
        super().__init__(f"service {service!r} crashed {restarts} times within its restart budget")
        self.service = service
        self.restarts = restarts


class NonRetryableError(TaskmeshError):
    """Raised by a handler: the run fails and the task goes straight to ``failed``.

    Use it for errors that another attempt cannot fix (bad input, a missing
    record); docs/internals/design.md section 3 lists it among the non-retryable outcomes.
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


RATE_LIMITED_MAX_SECONDS = 3600.0
"""The longest a ``RateLimited`` holds its keys back; a longer (or unreadable) ``retry_after`` is read as this."""


class RateLimited(TaskmeshError):
    """Raised by a handler when a downstream service says "too many requests" (an HTTP 429).

    The run is not a failure: the task goes back to wait ``retry_after`` seconds without spending a
    retry, and every task of its limit keys with a rate (else of all its limit keys) waits as long, on
    every instance, so that the whole key backs off, not one task.

    :param retry_after: seconds to wait (a ``Retry-After``), at least 0.001, at most
        :data:`RATE_LIMITED_MAX_SECONDS`; a value that is not a number is read as 1.
    """

    def __init__(self, retry_after: float = 1.0, reason: str = "rate limited") -> None:
        super().__init__(reason)
        self.retry_after = rate_limited_seconds(retry_after)


def rate_limited_seconds(value: object) -> float:
    """``RateLimited``'s ``retry_after`` as seconds it holds: a number kept within 0.001 and
    :data:`RATE_LIMITED_MAX_SECONDS`, anything else 1."""
    try:
        seconds = float(value)  # type: ignore[arg-type]  # any object a handler passed
    except (TypeError, ValueError):
        return 1.0
    if seconds != seconds:  # NaN
        return 1.0
    return min(max(seconds, 0.001), RATE_LIMITED_MAX_SECONDS)


class EmbeddedServerError(TaskmeshError):
    """An embedded server of the dev profile (``taskmesh.dev.stack``) could not be started again.

    The message names the server and what failed (pg_ctl's exit, Valkey not
    answering PING in time); the server's own log says more.
    """
