"""Answers of the queue routes: overviews, pauses, dead letters, replays and the per-minute history.

As for the task routes, these models document what the handlers write; the tests check real answers
against them (``tests/integration/test_openapi_contract.py``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from taskmesh.api.schemas.tasks import TaskSummary
from taskmesh.tasks.states import WorkerState


class QueuePause(BaseModel):
    """Whether a queue is paused, since when and why."""

    queue: str
    paused: bool
    paused_at: datetime | None
    reason: str | None


class QueueDepth(BaseModel):
    """Tasks of a queue by state: ready and delayed from Redis, the others from PostgreSQL."""

    ready: int
    delayed: int = Field(description="Due later, or waiting out a retry's backoff.")
    retrying: int
    running: int
    dead_letter: int


class QueueWorker(BaseModel):
    """A live instance serving a queue, with its concurrency there."""

    worker_id: str
    state: WorkerState
    concurrency: int


class RunCounts(BaseModel):
    """Runs that ended in one minute, by outcome."""

    succeeded: int
    retried: int
    failed: int
    cancelled: int
    interrupted: int


class QueueRuns(BaseModel):
    """Ended runs of the last full minute and of the current one."""

    last_minute: RunCounts
    this_minute: RunCounts


class Queue(QueuePause):
    """A queue's overview: pause, depths, age of its oldest ready task, the instances serving it, runs."""

    depth: QueueDepth
    oldest_ready_age_seconds: float
    workers: list[QueueWorker]
    concurrency: int = Field(description="The sum of its workers' concurrency.")
    runs: QueueRuns


class QueueList(BaseModel):
    """Queues by name."""

    queues: list[Queue]


class DeadLetters(BaseModel):
    """Dead-lettered tasks of a queue, oldest first; ``count`` is how many are listed."""

    queue: str
    count: int
    tasks: list[TaskSummary]


class Replayed(BaseModel):
    """Tasks moved back from the dead-letter queue."""

    queue: str
    count: int
    replayed: list[uuid.UUID]
    not_replayed: list[uuid.UUID] | None = Field(
        default=None, description="Only when ids were given: those not dead-lettered in this queue."
    )


class HistoryPoint(BaseModel):
    """One step of a queue's history (sampled values are ``null`` for a step without a row)."""

    at: datetime
    succeeded: int
    retried: int
    failed: int
    cancelled: int
    interrupted: int
    started: int
    wait_p95_seconds: float | None
    ready_max: int | None
    oldest_ready_max_seconds: float | None


class Rollup(BaseModel):
    """The per-minute rollup table: size on disk, estimated rows (``null`` before it was analyzed), oldest minute."""

    bytes: int
    rows: int | None
    since: datetime | None


class History(BaseModel):
    """Runs, waits and backlog per step, oldest first."""

    window: Literal["hour", "day"]
    queue: str | None = Field(description="``null``: every queue summed.")
    step_seconds: int
    points: list[HistoryPoint]
    rollup: Rollup
