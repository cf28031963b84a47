"""Why a task is not running: ``blocked_by`` of ``GET /api/v1/tasks/{id}``.

Each reason is one object: ``{"reason": "workflow", "workflow_id"}`` (a workflow's task waiting for its
deps), ``{"reason": "delay", "until"}`` (due later, or waiting out a retry's backoff),
``{"reason": "queue_paused"}``, ``{"reason": "fair_share", "key"}`` (in a queue with fair shares, waiting
its fairness key's turn: ``key`` is the key's value, a tenant or a payload field's), ``{"reason": "limit",
"limit", "key", "holds"}`` (parked until its
limit key has room: ``holds`` is ``concurrency``, ``rate`` or ``back_off``, with ``until_ms`` for a
back-off: ms since the Unix epoch, as ``backing_off_until_ms`` of ``GET /api/v1/limits``). A queued
task with no reason is ready: it waits for a free executor. A task that is not waiting (running, or
over) has ``null``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from taskmesh.errors import StoreError
from taskmesh.limits.book import FAIR_MARK, LimitBook, limit_name
from taskmesh.observability.logs import get_logger
from taskmesh.store import RedisStore
from taskmesh.tasks.states import TaskStatus

log = get_logger("taskmesh.limits")


async def blocked_by(redis: RedisStore, book: LimitBook, row: Any) -> list[dict[str, Any]] | None:
    """The reasons the task of ``row`` (``task_get_with_latest_run``) waits; see module docs.

    A Redis failure leaves the limit out (logged ``blocked_by_unknown``): PostgreSQL's reasons stand.
    """
    status = row["status"]
    if status == TaskStatus.BLOCKED:
        return [{"reason": "workflow", "workflow_id": str(row["workflow_id"])}]
    if status != TaskStatus.QUEUED:
        return None
    reasons: list[dict[str, Any]] = []
    if row["delayed"]:
        reasons.append({"reason": "delay", "until": _iso(row["run_at"])})
    if row["queue_paused"]:
        reasons.append({"reason": "queue_paused"})
    keys = row["limit_keys"]
    if keys:
        try:
            reasons += await _limit(redis, book, row["queue"], str(row["id"]), keys)
        except StoreError as exc:
            log.warning("blocked_by_unknown", task_id=str(row["id"]), error=str(exc))
    return reasons


async def _limit(redis: RedisStore, book: LimitBook, queue: str, task_id: str, keys: list[str]) -> list[dict[str, Any]]:
    """The limit key the task is parked under, and what holds it, if it is parked."""
    parked = await redis.limits.parked_under(queue, task_id, keys)
    if parked is None:
        return []
    if parked.startswith(FAIR_MARK):
        return [{"reason": "fair_share", "key": parked.removeprefix(FAIR_MARK)}]
    name = limit_name(parked)
    [(in_use, _, until)] = (await redis.limits.in_use(queue, [parked])).values()
    settings = book.limits.get(name)
    reason: dict[str, Any] = {"reason": "limit", "limit": name, "key": parked}
    if until is not None:
        reason.update(holds="back_off", until_ms=until)
    elif settings is not None and settings.concurrency is not None and in_use >= settings.concurrency:
        reason["holds"] = "concurrency"
    else:
        reason["holds"] = "rate" if settings is not None and settings.rate is not None else "concurrency"
    return [reason]


def _iso(value: datetime) -> str:
    return value.isoformat()
