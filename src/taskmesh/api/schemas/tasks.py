"""Answers of the task routes: tasks, runs, pages of a search, creates, cancels, retries, bulk operations.

Each model describes what the route's handler writes (``records.py`` and the facades build those dicts):
the routes return their JSON as is, so these models document the answers and are checked against real
answers by the tests (``tests/integration/test_openapi_contract.py``), not applied on the way out.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from taskmesh.api.schemas.problem import FieldError
from taskmesh.tasks.states import BulkAction, OperationStatus, RunStatus, TaskStatus, TaskType


class _TaskFields(BaseModel):
    """The columns of a task every answer shows."""

    id: uuid.UUID
    name: str
    type: TaskType
    queue_name: str
    priority: int
    dedup_key: str | None
    max_retries: int
    retries: int = Field(description="Retries spent in this delivery cycle.")
    attempts: int = Field(description="Runs over the task's whole life.")
    status: TaskStatus
    run_at: datetime | None = Field(description="When it is due.")
    tenant_id: str | None
    trace_id: str | None
    created_at: datetime
    updated_at: datetime


class Task(_TaskFields):
    """A task with its payload."""

    payload: Any = Field(description="The JSON value it was created with.")
    workflow_id: uuid.UUID | None = Field(default=None, description="The workflow it is a node of (null: none).")
    workflow_node: str | None = Field(default=None, description="Its node's id in that workflow.")
    map_index: int | None = Field(default=None, description="A map node's task: the index of its item.")
    blocked_by: list[dict[str, Any]] | None = Field(
        default=None,
        description="Why it is not running yet: each reason an object with `reason` (workflow, delay, "
        "queue_paused, fair_share, limit); "
        "empty: ready, waiting for a free executor; null: not waiting (running or over).",
    )


class RunSummary(BaseModel):
    """How a task's latest run went, as lists show it."""

    attempt: int
    status: RunStatus
    error: str | None
    finished_at: datetime | None


class TaskSummary(_TaskFields):
    """A task as lists show it: without its payload, with its latest run (``null`` before any)."""

    latest_run: RunSummary | None


class Run(BaseModel):
    """One run (attempt) of a task."""

    id: uuid.UUID
    task_id: uuid.UUID
    attempt: int
    status: RunStatus
    worker_id: str | None
    claimed_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    lease_expires_at: datetime | None
    next_retry_at: datetime | None
    error: str | None
    result: Any = Field(description="The handler's JSON result (``null`` until it succeeded).")
    created_at: datetime
    updated_at: datetime
    traceback: str | None = Field(default=None, description="Only in a task's list of runs.")


class TaskWithLatestRun(BaseModel):
    """A task and its latest run (``null`` before the first claim)."""

    task: Task
    latest_run: Run | None


class TaskRuns(BaseModel):
    """Every run of a task, by attempt."""

    task_id: uuid.UUID
    runs: list[Run]


class TaskPage(BaseModel):
    """One page of a task search; pass ``next_cursor`` as ``cursor`` for the next (``null``: no more)."""

    tasks: list[TaskSummary]
    next_cursor: str | None
    partial: bool = Field(description="The page stopped at its scan window: fewer tasks, more may follow.")


class TaskCreated(BaseModel):
    """A stored task (201), or the existing one its ``dedup_key`` names (200, ``deduplicated``)."""

    task_id: uuid.UUID
    status: TaskStatus
    trace_id: str | None
    deduplicated: bool | None = Field(default=None, description="Only in a 200: the dedup_key repeats.")
    warnings: list[str] | None = Field(default=None, description="Stored, but no live instance will run it yet.")


class BatchItem(BaseModel):
    """The outcome of one item of a batch, by its ``index`` in the request."""

    index: int
    status: Literal["created", "deduplicated", "rejected"]
    task_id: uuid.UUID | None = None
    trace_id: str | None = None
    warnings: list[str] | None = None
    errors: list[FieldError] | None = Field(default=None, description="Why it was refused (``tasks[3].priority``).")


class BatchCreated(BaseModel):
    """A batch's counts and each item's outcome."""

    created: int
    deduplicated: int
    rejected: int
    results: list[BatchItem]


class Cancellation(BaseModel):
    """A cancelled task (200), or a running one whose worker is asked to cancel it (202)."""

    task_id: uuid.UUID
    status: Literal["cancelled", "running"]
    cancel_requested: bool | None = Field(default=None, description="Only in a 202.")


class RetriedTask(BaseModel):
    """A task queued again, where, and what it was."""

    task_id: uuid.UUID
    status: TaskStatus
    queue_name: str
    priority: int
    previous_status: TaskStatus


class BulkDryRun(BaseModel):
    """How many tasks a bulk filter matches now, and a few of their ids."""

    action: BulkAction
    matched: int
    complete: bool = Field(description="False when counting stopped at its bound: more may match.")
    sample: list[uuid.UUID]


class Operation(BaseModel):
    """A bulk operation and its progress."""

    operation_id: uuid.UUID
    action: BulkAction
    status: OperationStatus
    filter: dict[str, Any]
    reason: str | None
    tenant_id: str | None
    queues: list[str] | None
    done: int
    skipped: int
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
