"""Task and run states, the allowed transitions and the terminal sets (design.md section 3).

Pure: imports nothing of taskmesh.
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
    FAILED = "failed"  # failed with no retry left, or not retryable


TASK_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.QUEUED: frozenset({TaskStatus.RUNNING, TaskStatus.CANCELLED}),
    TaskStatus.RUNNING: frozenset({TaskStatus.COMPLETED, TaskStatus.QUEUED, TaskStatus.FAILED}),
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


def can_transition_task(old: TaskStatus, new: TaskStatus) -> bool:
    """Whether design.md's state machine allows a task to go from ``old`` to ``new``."""
    return new in TASK_TRANSITIONS[old]


def can_transition_run(old: RunStatus, new: RunStatus) -> bool:
    """Whether design.md's state machine allows a run to go from ``old`` to ``new``."""
    return new in RUN_TRANSITIONS[old]
