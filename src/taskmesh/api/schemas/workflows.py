"""Answers of the workflow routes: a submission (one or a batch), a workflow with its nodes, a page, a cancel,
a retry.

As for the task routes, these models document what the handlers write and are checked against real
answers by the tests (``tests/integration/test_openapi_contract.py``), not applied on the way out.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from taskmesh.api.schemas.problem import FieldError
from taskmesh.tasks.states import DepFailure, NodeKind, NodeStatus, WorkflowStatus


class WorkflowCreated(BaseModel):
    """Answer of ``POST /api/v1/workflows``."""

    workflow_id: uuid.UUID
    status: WorkflowStatus
    trace_id: str | None = Field(description="Carried by every task of the workflow.")
    nodes: dict[str, uuid.UUID | list[uuid.UUID]] = Field(
        description="Each node's task id; a map node's task ids in item order (none yet for a map over a "
        "dep's result); the callbacks under on_failure and finally. Deduplicated: the first workflow's."
    )
    deduplicated: bool | None = Field(default=None, description="True when dedup_key named an existing workflow.")


class WorkflowBatchItem(BaseModel):
    """The outcome of one item of a batch of workflows, by its ``index`` in the request."""

    index: int
    status: Literal["created", "deduplicated", "rejected"] = Field(
        description="deduplicated: its dedup_key is taken, or repeats an earlier item's (that workflow answers)."
    )
    workflow_id: uuid.UUID | None = None
    trace_id: str | None = None
    nodes: dict[str, uuid.UUID | list[uuid.UUID]] | None = Field(
        default=None, description="As the answer of POST /api/v1/workflows names them."
    )
    errors: list[FieldError] | None = Field(
        default=None, description="Why it was refused (``workflows[3].nodes[0].deps``)."
    )


class WorkflowBatchCreated(BaseModel):
    """Answer of ``POST /api/v1/workflows:batch``: its counts and each item's outcome."""

    created: int
    deduplicated: int
    rejected: int
    results: list[WorkflowBatchItem]


class WorkflowSummary(BaseModel):
    """A workflow as a listing shows it."""

    workflow_id: uuid.UUID
    name: str
    status: WorkflowStatus
    tenant_id: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = Field(description="When its last task ended (null while it runs).")
    counts: dict[str, int] = Field(description="Its tasks by status.")


class WorkflowNode(BaseModel):
    """One node of a workflow."""

    id: str
    task: str
    kind: NodeKind
    deps: list[str]
    on_dep_failure: DepFailure
    map_from: str | None
    status: NodeStatus
    state: Literal["blocked", "running", "succeeded", "failed", "skipped", "cancelled"] = Field(
        description="One word: blocked (waiting for deps), running (a task of it is queued or runs), "
        "succeeded, failed, skipped, cancelled."
    )
    counts: dict[str, int] = Field(description="Its tasks by status.")
    started_at: datetime | None
    finished_at: datetime | None
    waiting_for: list[str] = Field(description="The deps it waits for (a callback: the nodes not ended).")
    error: str | None = Field(
        description="Why it failed: a map node's error making its tasks, else its failed task's latest error."
    )
    task_id: uuid.UUID | None = Field(default=None, description="A task or callback node's task.")
    task_ids: list[uuid.UUID] | None = Field(default=None, description="A map node's tasks (the first 1,000).")


class WorkflowDetail(BaseModel):
    """Answer of ``GET /api/v1/workflows/{id}``."""

    workflow_id: uuid.UUID
    name: str
    status: WorkflowStatus
    tenant_id: str | None
    dedup_key: str | None
    trace_id: str | None
    context: Any
    cancel_reason: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    counts: dict[str, int]
    nodes: list[WorkflowNode]


class WorkflowPage(BaseModel):
    """Answer of ``GET /api/v1/workflows``."""

    workflows: list[WorkflowSummary]
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null on the last.")


class WorkflowCancelled(BaseModel):
    """Answer of ``POST /api/v1/workflows/{id}/cancel``."""

    workflow_id: uuid.UUID
    status: Literal["cancelled"]
    cancelled: int = Field(description="Blocked and queued tasks ended now.")
    cancel_requested: int = Field(description="Running tasks asked to stop.")


class WorkflowRetried(BaseModel):
    """Answer of ``POST /api/v1/workflows/{id}/retry``."""

    workflow_id: uuid.UUID
    status: Literal["running"]
    requeued: int = Field(description="Tasks made ready now.")
    reblocked: int = Field(description="Tasks waiting for their deps again.")
