"""Plain records passed between taskmesh's services: frozen dataclasses, no I/O (imports only ``states``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from taskmesh.tasks.states import Outcome

__all__ = ["ClaimedTask", "Enqueued", "Outcome", "PushTarget", "RunResult", "TaskContext"]


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """A task this instance owns for one run, as returned by the claim.

    ``retries`` is the number of retries spent in this delivery cycle before
    this run; ``attempt`` numbers runs over the task's whole life (1, 2, ...).
    """

    task_id: UUID
    run_id: UUID
    name: str
    queue: str
    priority: int
    payload: Any
    attempt: int
    retries: int
    max_retries: int
    idempotency_key: str | None
    trace_id: str | None
    tenant_id: str | None
    ready_at: float | None = None
    """When the task became runnable (created, due, or its retry's backoff ended), epoch seconds."""
    defect: str | None = None
    """Why this version cannot run the claimed row (its payload is unreadable, its deps' results are over
    the bound): the run fails at once."""
    timeout: float | None = None
    """The task's own timeout, seconds (a workflow node's ``timeout``); ``None``: the handler's."""
    workflow_id: UUID | None = None
    """The workflow the task is a node of (``None``: a task of its own)."""
    workflow_node: str | None = None
    map_index: int | None = None
    limit_keys: list[str] | None = None
    """The limit keys whose slots this run holds (``limits/book.py``); ``None``: none."""
    workflow: dict[str, Any] | None = None
    """What ``ctx.workflow`` says (see :class:`TaskContext`); filled in after the claim."""
    parents: dict[str, Any] = field(default_factory=dict)
    """What ``ctx.parents`` says (see :class:`TaskContext`); filled in after the claim."""

    def context(self) -> TaskContext:
        """The :class:`TaskContext` a handler of this run is given (everything but the payload)."""
        return TaskContext(
            task_id=self.task_id,
            run_id=self.run_id,
            name=self.name,
            queue=self.queue,
            priority=self.priority,
            attempt=self.attempt,
            retries=self.retries,
            max_retries=self.max_retries,
            idempotency_key=self.idempotency_key,
            trace_id=self.trace_id,
            tenant_id=self.tenant_id,
            parents=self.parents,
            workflow=self.workflow,
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    """The end of one run, on its way to the committer.

    :param delay_seconds: for ``RETRY``, seconds until the next attempt.
    :param result: JSON text of a successful handler's return value (``None`` otherwise),
        storable in PostgreSQL (see ``taskmesh.tasks.storable``).
    :param duration_seconds: wall time of the handler, seconds.
    :param traceback: the handler's traceback when it raised (bounded), else ``None``.
    :param back_off_seconds: see the field.
    """

    task: ClaimedTask
    outcome: Outcome
    error: str | None = None
    result: str | None = None
    delay_seconds: float = 0.0
    duration_seconds: float = 0.0
    traceback: str | None = None
    back_off_seconds: float | None = None
    """How long the task's limit keys wait (the handler raised ``RateLimited``); ``None``: they do not."""


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a handler may want to know about the run it is executing.

    Handlers must be idempotent (docs/internals/design.md principle 4): ``task_id``,
    ``attempt`` and ``idempotency_key`` let them check for earlier effects.

    A task of a workflow also gets ``parents``: each dep's node id mapped to its result (a list in
    item order for a map node; ``None`` for a dep that did not succeed, under ``on_dep_failure``
    ``ignore`` or ``continue``, or has not ended, under ``continue``), and ``workflow``:
    ``{"id", "name", "context", "node", "map_index"}``, plus ``"summary"`` (each node's state:
    ``succeeded``, ``failed``, ``skipped`` or ``cancelled``) for an ``on_failure`` or
    ``finally`` callback. Outside a workflow, ``parents`` is empty and ``workflow`` is ``None``.
    """

    task_id: UUID
    run_id: UUID
    name: str
    queue: str
    priority: int
    attempt: int
    retries: int
    max_retries: int
    idempotency_key: str | None
    trace_id: str | None
    tenant_id: str | None
    parents: dict[str, Any] = field(default_factory=dict)
    workflow: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class PushTarget:
    """Where a queued task's id goes in Redis after a commit.

    ``due_at`` is ``None`` for a task that is runnable now (ready set), else the
    time it becomes due (delayed set). ``limit_keys``: the limit keys it holds (``limits/book.py``),
    written beside its id so that the admission stage can hold it to them.
    """

    task_id: UUID
    queue: str
    priority: int
    due_at: datetime | None
    limit_keys: tuple[str, ...] | list[str] | None = None
    moved: bool = False
    """The id may sit in Redis at an earlier due time (a debounced task replaced): it is taken out first."""


@dataclass(frozen=True, slots=True)
class Enqueued:
    """Answer of :meth:`~taskmesh.tasks.tasks.Tasks.enqueue` (and one per task of the bulk enqueues).

    ``created`` is ``False`` when the idempotency key named an existing task,
    whose id and current status are returned. ``queue`` is the queue a created
    task went to (the request's, or its handler's default); ``None`` when deduplicated.
    """

    task_id: UUID
    status: str
    created: bool
    trace_id: str | None = None
    queue: str | None = None
