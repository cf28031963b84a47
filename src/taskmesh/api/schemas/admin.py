"""Answers of the schedule, worker, key, audit and health routes.

As for the task routes, these models document what the handlers write; the tests check real answers
against them (``tests/integration/test_openapi_contract.py``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from taskmesh.api.schemas.queues import QueuePause
from taskmesh.tasks.states import WorkerState


class FireTime(BaseModel):
    """A fire time in UTC and in the schedule's zone (``local`` is ``null`` when the zone is unknown)."""

    utc: datetime
    local: datetime | None


class Schedule(BaseModel):
    """A cron schedule, its state, its last fire and its next five."""

    name: str
    cron: str
    timezone: str
    task: str
    queue: str | None
    priority: int
    payload: Any
    max_retries: int | None
    misfire: Literal["skip", "once", "all"]
    misfire_grace_seconds: float
    overlap: Literal["allow", "skip"]
    tenant_id: str | None
    enabled: bool
    paused: bool
    state: Literal["active", "paused", "disabled", "overdue"] = Field(
        description="``overdue``: active, but its next fire passed more than the grace ago (no scheduler fires it)."
    )
    last_fire: FireTime | None
    next_fires: list[FireTime]
    last_task_id: uuid.UUID | None
    synced_at: datetime
    error: str | None = Field(description="Why this version cannot read the row (an unknown zone).")


class ScheduleList(BaseModel):
    """Schedules by name."""

    schedules: list[Schedule]


class ScheduleFired(BaseModel):
    """The task a trigger made (201), or the one its ``idempotency_key`` already made (200)."""

    schedule: str
    task_id: uuid.UUID
    idempotency_key: str
    created: bool


class Worker(BaseModel):
    """A registered instance."""

    id: str
    host: str
    pid: int
    queues: dict[str, int] = Field(description="Each queue it serves, with its concurrency there.")
    version: str
    state: WorkerState
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    in_flight: int = Field(description="Its running runs.")


class UnservedQueue(BaseModel):
    """A queue holding queued tasks that no live instance serves."""

    queue: str
    queued: int


class WorkerList(BaseModel):
    """Instances (live first), the queues none of them serves, the paused queues."""

    workers: list[Worker]
    unserved_queues: list[UnservedQueue]
    paused_queues: list[QueuePause]


class KeyState(StrEnum):
    """Whether a key is accepted."""

    ACTIVE = "active"
    REVOKED = "revoked"
    EXPIRED = "expired"


class RateLimits(BaseModel):
    """A key's own request rates by class, requests per second (a class left out: the settings')."""

    read: float | None = None
    write: float | None = None
    admin: float | None = None


class Key(BaseModel):
    """An API key as listed: never its secret or hash."""

    key_id: str
    name: str
    scopes: list[str]
    tenant_id: str | None
    queues: list[str] | None
    rate_limits: RateLimits | None = Field(description="``null``: the settings' rates.")
    expires_at: datetime | None
    revoked_at: datetime | None
    created_at: datetime
    last_used_at: datetime | None
    state: KeyState


class KeyList(BaseModel):
    """Keys, newest first."""

    keys: list[Key]


class NewKey(Key):
    """A key just made: ``key`` is shown this once."""

    key: str


class RotatedKey(NewKey):
    """The new key of a rotation, and when the key it replaces ends."""

    replaces: str
    replaced_key_expires_at: datetime


class AuditActor(BaseModel):
    """Who acted: a key, the CLI's OS user, the system, or nobody known."""

    type: Literal["key", "cli", "system", "anonymous"]
    id: str | None
    name: str | None


class AuditEvent(BaseModel):
    """One entry of the audit log."""

    id: int
    at: datetime
    actor: AuditActor
    tenant_id: str | None
    action: str
    resource_type: str | None
    resource_id: str | None
    outcome: Literal["ok", "denied", "error"]
    status: int | None
    reason: str | None
    trace_id: str | None
    client_addr: str | None
    user_agent: str | None
    details: dict[str, Any] | None


class AuditPage(BaseModel):
    """One page of the audit log, newest first; pass ``next_cursor`` as ``cursor`` for the next."""

    events: list[AuditEvent]
    next_cursor: str | None


class Liveness(BaseModel):
    """The process serves."""

    status: Literal["ok"]
    version: str = Field(description="The release this instance runs (the package's version: `0.2.0`).")


class StoreState(StrEnum):
    """A store as readiness sees it: ``error`` is an answer taskmesh cannot work with (``MOVED``, say)."""

    OK = "ok"
    DOWN = "down"
    ERROR = "error"
    CONNECTING = "connecting"


class SchemaMismatch(BaseModel):
    """The last statement PostgreSQL refused against its schema (run ``taskmesh migrate``, or replace the instance)."""

    operation: str = Field(description="The named statement (task_insert_many).")
    sqlstate: str = Field(description="PostgreSQL's SQLSTATE, class 42 (42703: an undefined column).")
    seconds_ago: float = Field(description="How long ago it was refused, seconds.")


class Readiness(BaseModel):
    """Whether the instance takes work; each store's state, and what is down."""

    ready: bool
    postgres: StoreState
    redis: StoreState
    errors: dict[str, str] | None = Field(default=None, description="A store's answer taskmesh cannot work with.")
    services: dict[str, str] | None = Field(default=None, description="Services restarting or failed, by name.")
    draining: bool | None = Field(default=None, description="Only while the instance drains.")
    schema_mismatch: SchemaMismatch | None = Field(
        default=None,
        description="Only while PostgreSQL refused a statement against its schema within "
        "schema_error_window_seconds: this release and the database's schema disagree.",
    )
