"""Runs bulk operations (``POST /api/v1/tasks:bulk``) in batches, on whichever instance holds each one's lease.

Every ``interval`` (1 s) the service (``operations``, optional, every instance) takes
the oldest running operation nobody holds (its lease, 30 s, is free or expired) and
works through its filter's matches oldest first, :data:`BATCH` tasks at a time:
in one transaction the action is applied to the batch's tasks that are still in a
state it applies to (the others count as ``skipped``), and the operation's cursor
and counters move; after the commit Redis follows (pushes, DLQ entries, the ends
announced). Each task is thus acted on once, also while workers run: an instance
that dies mid-way leaves the cursor at its last committed batch, and the next
holder goes on from there (what Redis missed, the reconciler repairs). A filter
that cannot be read (stored by another version) fails the operation with that error.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import orjson

from taskmesh.errors import InvalidTaskError, StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.security.tenancy import Reach
from taskmesh.services.base import Counts, run_periodic
from taskmesh.tasks.bulk import parse_filter
from taskmesh.tasks.models import PushTarget
from taskmesh.tasks.search import START, WINDOW
from taskmesh.tasks.states import BulkAction, OperationStatus
from taskmesh.tasks.tasks import Tasks

log = get_logger("taskmesh.operations")

BATCH = 500
"""Tasks acted on per transaction."""
LEASE_SECONDS = 30.0
FROM_STATUSES = {BulkAction.RETRY: ["failed", "cancelled"], BulkAction.REPLAY: ["failed"]}


class LeaseLost(Exception):
    """Another instance took the operation over: this batch is rolled back and the holder goes on."""


async def run_once(tasks: Tasks, owner: str) -> Counts:
    """Carry out the oldest free operation to its end; returns ``{"done", "skipped"}`` of this pass.

    :raises StoreError: a store failed (the lease expires and another pass goes on).
    """
    op = await tasks.pg.operations.take(owner, LEASE_SECONDS)
    if op is None:
        return {}
    filter_ = op["filter"]
    try:
        f = parse_filter(dict(orjson.loads(filter_)) if isinstance(filter_, str) else filter_)
    except InvalidTaskError as exc:
        await tasks.pg.operations.finish(op["id"], owner, OperationStatus.FAILED, f"filter not readable: {exc}")
        return {}
    reach = Reach(op["tenant_id"], None if op["queues"] is None else frozenset(op["queues"]))
    narrowed = reach.narrow(f)  # the starting key's tenant and queues bound what it acts on
    if narrowed is None:
        await tasks.pg.operations.finish(op["id"], owner, OperationStatus.DONE, None)
        return {}
    f = narrowed
    action = BulkAction(op["action"])
    cursor = (op["cursor_created_at"], op["cursor_id"]) if op["cursor_id"] is not None else START["asc"]
    done = skipped = 0
    while True:
        rows = await tasks.pg.search.page(f, "asc", cursor, WINDOW, BATCH)
        if rows:
            cursor = (rows[-1]["created_at"], rows[-1]["id"])
            try:
                acted = await _apply(tasks, op["id"], owner, action, [r["id"] for r in rows], cursor)
            except LeaseLost:
                log.warning("operation_lease_lost", operation_id=str(op["id"]))
                return {"done": done, "skipped": skipped}
            done, skipped = done + acted, skipped + len(rows) - acted
            continue
        end = await tasks.pg.search.window_end(f, "asc", cursor, WINDOW)
        if end is not None and end["scanned"] >= WINDOW:  # nothing matched in this window: go on after it
            cursor = (end["created_at"], end["id"])
            if not await tasks.pg.operations.advance(op["id"], owner, cursor, 0, 0, LEASE_SECONDS):
                return {"done": done, "skipped": skipped}
            continue
        ended = await tasks.pg.operations.finish(op["id"], owner, OperationStatus.DONE, None)
        if ended is not None:
            log.info(
                "operation_done",
                operation_id=str(op["id"]),
                action=action.value,
                done=ended["done"],
                skipped=ended["skipped"],
                reason=ended["reason"],
            )
        return {"done": done, "skipped": skipped}


async def _apply(
    tasks: Tasks,
    op_id: uuid.UUID,
    owner: str,
    action: BulkAction,
    ids: list[uuid.UUID],
    cursor: tuple[datetime, uuid.UUID],
) -> int:
    """Act on one batch and move the operation on, in one transaction; then Redis follows.

    :returns: how many tasks the action applied to.
    :raises LeaseLost: the operation is another instance's now (nothing was written).
    """
    async with tasks.pg.transaction() as tx:
        changed: list[Any]
        if action in FROM_STATUSES:
            changed = await tx.tasks.requeue(ids, FROM_STATUSES[action])
        elif action is BulkAction.CANCEL:
            changed = await tx.operations.cancel(ids)
        else:
            changed = await tx.operations.delete(ids)
        if not await tx.operations.advance(op_id, owner, cursor, len(changed), len(ids) - len(changed), LEASE_SECONDS):
            raise LeaseLost
    try:
        await _follow_in_redis(tasks, action, changed)
    except StoreError as exc:  # PostgreSQL has it: the reconciler pushes and mirrors later
        log.warning("redis_push_failed", tasks=len(changed), error=str(exc))
    return len(changed)


async def _follow_in_redis(tasks: Tasks, action: BulkAction, changed: list[Any]) -> None:
    if action in FROM_STATUSES:
        await tasks.redis.forget_many([(r["queue"], str(r["id"])) for r in changed])  # out of the DLQ
        await tasks.push([PushTarget(r["id"], r["queue"], r["priority"], None, r["limit_keys"]) for r in changed])
    elif action is BulkAction.CANCEL:
        await tasks.mirror(changed)  # transition rows: cancelled ones leave Redis, running ones are asked to stop
    else:
        await tasks.redis.forget_many([(r["queue"], str(r["id"])) for r in changed])


async def run(tasks: Tasks, owner: str, *, interval: float = 1.0) -> None:
    """Look for operations every ``interval`` seconds for ever (cancelled by the supervisor)."""
    await run_periodic("operations", lambda: run_once(tasks, owner), interval=interval, event="operation_batches")
