"""Task, run and worker states, run outcomes, the allowed transitions, terminal sets (docs/internals/design.md §3).

Pure: imports nothing of taskmesh. Every status string the Python code writes
or compares comes from here; ``tests/unit/test_states.py`` checks that these
sets equal the ``CHECK`` constraints of the migrations, so the database and
the code cannot drift apart.
"""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    """Status of a task row (``tasks.status``)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"  # dead-lettered: terminal until replay
    CANCELLED = "cancelled"


class RunStatus(StrEnum):
    """Status of a run row (``task_runs.status``), one attempt of a task."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    RETRYING = "retrying"  # failed, will run again; next_retry_at is set
    FAILED = "failed"  # failed with no retry left, not retryable, or cancelled


class TaskType(StrEnum):
    """How a task was scheduled (``tasks.type``, the original API's ``type``)."""

    IMMEDIATE = "immediate"
    DELAYED = "delayed"
    CRON = "cron"


class OperationStatus(StrEnum):
    """State of a bulk operation (``operations.status``)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class BulkAction(StrEnum):
    """What a bulk operation does to each task its filter matches (``operations.action``)."""

    RETRY = "retry"  # failed or cancelled -> queued, fresh retry budget
    REPLAY = "replay"  # failed -> queued, fresh retry budget
    CANCEL = "cancel"  # queued -> cancelled; running: cancel requested
    DELETE = "delete"  # finished -> deleted with its runs


class WorkerState(StrEnum):
    """State of an instance's row in ``workers``."""

    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
    LOST = "lost"  # silent for three leases


class Outcome(StrEnum):
    """How a run ended, as the executor reports it to the committer (``run_finish_many``'s outcome)."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"  # failed, retry allowed and budget left
    FAILED = "failed"  # failed for good: dead-letter
    INTERRUPTED = "interrupted"  # shutdown handed it back: requeue, no retry spent
    CANCELLED = "cancelled"  # an operator cancelled the running task


TASK_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.QUEUED: frozenset({TaskStatus.RUNNING, TaskStatus.CANCELLED}),
    TaskStatus.RUNNING: frozenset({TaskStatus.COMPLETED, TaskStatus.QUEUED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    TaskStatus.COMPLETED: frozenset(),
    TaskStatus.FAILED: frozenset({TaskStatus.QUEUED}),  # replay
    TaskStatus.CANCELLED: frozenset(),
}

RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.FAILED}),  # failed: cancelled before it ran
    RunStatus.RUNNING: frozenset({RunStatus.SUCCEEDED, RunStatus.RETRYING, RunStatus.FAILED}),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.RETRYING: frozenset(),
    RunStatus.FAILED: frozenset(),
}

TERMINAL_TASK_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED})
"""Statuses a task never leaves (``failed`` is left only by an operator's replay)."""
FINISHED_TASK_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})
"""Statuses of a task that will not run again unless an operator acts (cancel answers 409 for these)."""
LIVE_WORKER_STATES = frozenset({WorkerState.RUNNING, WorkerState.DRAINING})
"""Worker states of an instance that beats."""


def can_transition_task(old: TaskStatus, new: TaskStatus) -> bool:
    """Whether docs/internals/design.md's state machine allows a task to go from ``old`` to ``new``."""
    return new in TASK_TRANSITIONS[old]


def can_transition_run(old: RunStatus, new: RunStatus) -> bool:
    """Whether docs/internals/design.md's state machine allows a run to go from ``old`` to ``new``."""
    return new in RUN_TRANSITIONS[old]
