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

    BLOCKED = "blocked"  # a workflow's task waiting for its deps: not claimable, not in Redis
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"  # dead-lettered: terminal until replay
    CANCELLED = "cancelled"
    SKIPPED = "skipped"  # a workflow's task a failed dep will never let run


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


class WorkflowStatus(StrEnum):
    """Status of a workflow (``workflows.status``)."""

    RUNNING = "running"
    COMPLETED = "completed"  # every node succeeded
    FAILED = "failed"  # a node failed, was skipped or cancelled
    CANCELLED = "cancelled"  # an operator cancelled it


class NodeStatus(StrEnum):
    """Status of a workflow's node (``workflow_nodes.status``); its tasks carry the rest."""

    BLOCKED = "blocked"  # waiting for its deps
    RELEASED = "released"  # its tasks exist and are not blocked
    SKIPPED = "skipped"  # a failed dep under on_dep_failure "fail"
    FAILED = "failed"  # a map whose source's result is not a list
    CANCELLED = "cancelled"  # its workflow was cancelled before it was released


class NodeKind(StrEnum):
    """What a workflow's node is (``workflow_nodes.kind``)."""

    TASK = "task"
    MAP = "map"  # one task per item
    ON_FAILURE = "on_failure"  # runs once when the workflow fails
    FINALLY = "finally"  # runs once when the workflow ends


class DepFailure(StrEnum):
    """What a node does when one of its deps fails (``workflow_nodes.on_dep_failure``)."""

    FAIL = "fail"  # it is skipped, and so are its descendants
    IGNORE = "ignore"  # it runs once every dep ended, seeing the failure
    CONTINUE = "continue"  # it runs at a dep's first failure (not waiting for the others), else once all ended


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
    # released when its deps ended; skipped by a failed dep; cancelled with its workflow
    TaskStatus.BLOCKED: frozenset({TaskStatus.QUEUED, TaskStatus.SKIPPED, TaskStatus.CANCELLED}),
    TaskStatus.QUEUED: frozenset({TaskStatus.RUNNING, TaskStatus.CANCELLED}),
    TaskStatus.RUNNING: frozenset({TaskStatus.COMPLETED, TaskStatus.QUEUED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    TaskStatus.COMPLETED: frozenset(),
    # replay (queued); a workflow's retry from failure (blocked, or queued when its deps completed)
    TaskStatus.FAILED: frozenset({TaskStatus.QUEUED, TaskStatus.BLOCKED}),
    TaskStatus.CANCELLED: frozenset({TaskStatus.QUEUED, TaskStatus.BLOCKED}),  # an operator's retry
    TaskStatus.SKIPPED: frozenset({TaskStatus.QUEUED, TaskStatus.BLOCKED}),  # a workflow's retry
}

RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.FAILED}),  # failed: cancelled before it ran
    RunStatus.RUNNING: frozenset({RunStatus.SUCCEEDED, RunStatus.RETRYING, RunStatus.FAILED}),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.RETRYING: frozenset(),
    RunStatus.FAILED: frozenset(),
}

TERMINAL_TASK_STATUSES = frozenset({TaskStatus.COMPLETED})
"""Statuses a task never leaves (``failed``, ``cancelled`` and ``skipped`` are left only by an operator's retry)."""
FINISHED_TASK_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.SKIPPED})
"""Statuses of a task that will not run again unless an operator acts (cancel answers 409 for these)."""
LIVE_WORKER_STATES = frozenset({WorkerState.RUNNING, WorkerState.DRAINING})
"""Worker states of an instance that beats."""


def can_transition_task(old: TaskStatus, new: TaskStatus) -> bool:
    """Whether docs/internals/design.md's state machine allows a task to go from ``old`` to ``new``."""
    return new in TASK_TRANSITIONS[old]


def can_transition_run(old: RunStatus, new: RunStatus) -> bool:
    """Whether docs/internals/design.md's state machine allows a run to go from ``old`` to ``new``."""
    return new in RUN_TRANSITIONS[old]
