"""The audit log: who did what to which resource, and how it ended.

An :class:`AuditEvent` is opened for each API request (``taskmesh.api.audit_trail``) and
for each ``taskmesh keys`` command (actor ``cli`` with the OS user). While it is
:data:`CURRENT`, the first PostgreSQL transaction that commits carries the event's row
(the store calls :func:`write_before_commit` just before its commit): a change and its
record commit together or not at all. An event no transaction carried (a denied or failed
request, a change made by one statement) is written on its own when the request ends.
Every event is also one JSON log line (``audit``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import orjson

from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.store import PgStore
from taskmesh.store.postgres import BEFORE_COMMIT

log = get_logger("taskmesh.security.audit")

DETAILS_MOST = 4096
"""Most bytes of an event's details as JSON; longer ones are cut to a note saying so."""


@dataclass
class AuditEvent:
    """One audited action.

    :param actor_type: ``key``, ``cli``, ``system`` or ``anonymous`` (an open instance, or no usable key).
    :param actor_id: the key id, or the OS user for ``cli``.
    :param outcome: ``ok``, ``denied`` (401, 403) or ``error`` (any other refusal or failure).
    :param read_only: the request changed nothing (a bulk dry run): recorded only when denied.
    """

    action: str
    actor_type: str = "anonymous"
    actor_id: str | None = None
    actor_name: str | None = None
    tenant_id: str | None = None
    resource_type: str | None = None
    resource_id: str | None = None
    outcome: str = "ok"
    status: int | None = None
    reason: str | None = None
    trace_id: str | None = None
    client_addr: str | None = None
    user_agent: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    read_only: bool = False
    written: bool = False
    prepare: Callable[[], None] | None = None
    """Fills in the actor, action and resource just before the row is written (the API's middleware
    knows them once the route's guard ran)."""

    def values(self) -> tuple[Any, ...]:
        """The row's columns in ``audit_insert``'s order (details bounded to :data:`DETAILS_MOST` bytes)."""
        details = orjson.dumps(self.details).decode() if self.details else None
        if details is not None and len(details) > DETAILS_MOST:
            details = orjson.dumps({"truncated": True, "bytes": len(details)}).decode()
        return (
            self.actor_type,
            self.actor_id,
            self.actor_name,
            self.tenant_id,
            self.action,
            self.resource_type,
            self.resource_id,
            self.outcome,
            self.status,
            self.reason,
            self.trace_id,
            self.client_addr,
            (self.user_agent or "")[:512] or None,
            details,
        )

    def log_fields(self) -> dict[str, Any]:
        """The event as the ``audit`` log line's fields."""
        hidden = ("read_only", "written", "prepare")
        fields = {k: v for k, v in self.__dict__.items() if k not in hidden and v not in (None, {})}
        return fields


CURRENT: ContextVar[AuditEvent | None] = ContextVar("taskmesh_audit_event", default=None)
"""The event of the request (or CLI command) being served, if any."""


def note(**fields: Any) -> None:
    """Add to the current event (no-op outside one): its columns by name, ``details`` merged."""
    event = CURRENT.get()
    if event is None:
        return
    for name, value in fields.items():
        if name == "details":
            event.details.update(value)
        else:
            setattr(event, name, value)


async def write(pg: PgStore, event: AuditEvent) -> None:
    """Insert ``event`` on ``pg`` (a transaction's store, or the pool's).

    :raises StoreError: PostgreSQL failed.
    """
    if event.prepare is not None:
        event.prepare()
    await pg.audit.insert(*event.values())
    event.written = True


async def write_before_commit(tx: PgStore) -> None:
    """The store's hook: the current event's row in the transaction about to commit (once per event)."""
    event = CURRENT.get()
    if event is not None and not event.written and not event.read_only and event.outcome == "ok":
        await write(tx, event)


def emit(event: AuditEvent) -> None:
    """The event's JSON log line."""
    log.info("audit", **event.log_fields())


@contextlib.asynccontextmanager
async def recorded(pg: PgStore, event: AuditEvent) -> AsyncIterator[AuditEvent]:
    """Record ``event`` for a block outside the API (the CLI's direct commands).

    The block's first committed transaction carries the row; a block without one gets it
    written after. A block that raises is recorded as ``error`` with why, and the exception
    goes on. A block that noted no resource (it found nothing to act on) is not recorded.
    """
    event_token = CURRENT.set(event)
    hook_token = BEFORE_COMMIT.set(write_before_commit)
    try:
        yield event
    except Exception as exc:
        event.outcome, event.details["error"] = "error", str(exc)[:500]
        event.written = False  # a change that committed before the failure keeps its own row
        raise
    finally:
        BEFORE_COMMIT.reset(hook_token)
        CURRENT.reset(event_token)
        if event.outcome == "error" or event.resource_id is not None:
            if not event.written:
                try:
                    await write(pg, event)
                except StoreError as exc:
                    log.warning("audit_unwritten", action=event.action, error=str(exc))
            emit(event)
