"""What an operator does to one task, or to a queue's dead letters: cancel, retry, delete, replay.

:class:`TaskActions` is the part of the :class:`taskmesh.tasks.tasks.Tasks` facade that acts
on tasks an operator names (the API's routes and the clients call it): each action
locks the task's row, checks that its state allows it (else a clear error naming the
state and what to do), writes PostgreSQL first, then Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from taskmesh.errors import StoreError, TaskFinishedError, TaskNotFoundError, TaskStateError
from taskmesh.limits.book import LimitBook
from taskmesh.observability.logs import get_logger
from taskmesh.store import PgStore, RedisStore
from taskmesh.tasks.models import PushTarget
from taskmesh.tasks.states import TaskStatus

log = get_logger("taskmesh.tasks.tasks")

RETRYABLE = (TaskStatus.FAILED, TaskStatus.CANCELLED)
"""The states an operator's retry takes a task from."""


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Answer of :meth:`Tasks.cancel`.

    ``status`` is the task's status after the call: ``cancelled`` (it was
    queued and will never run) or ``running`` (cancellation requested: its
    worker cancels the handler on its next heartbeat). ``previous`` is the
    status found.
    """

    task_id: uuid.UUID
    status: str
    previous: str


@dataclass(frozen=True, slots=True)
class Retried:
    """Answer of :meth:`Tasks.retry`: the task queued again, where, and what it was."""

    task_id: uuid.UUID
    status: str
    queue: str
    priority: int
    previous_status: str


class TaskActions:
    """Operator actions of the task facade (mixed into :class:`taskmesh.tasks.tasks.Tasks`, which provides
    ``pg``, ``redis`` and ``push``)."""

    pg: PgStore
    redis: RedisStore
    limits: LimitBook

    async def learn(self) -> None:
        """Read the limits set at run time when stale (:meth:`taskmesh.tasks.tasks.Tasks.learn` does it)."""
        raise NotImplementedError

    async def push(self, targets: Sequence[PushTarget]) -> None:
        """Push ids into Redis (:meth:`taskmesh.tasks.tasks.Tasks.push` does it)."""
        raise NotImplementedError

    async def mirror(self, rows: Sequence[Any]) -> None:
        """The Redis follow-up of transition rows (:meth:`taskmesh.tasks.tasks.Tasks.mirror` does it)."""
        raise NotImplementedError

    async def cancel(self, task_id: uuid.UUID) -> Cancelled:
        """Cancel a task.

        A queued task (ready, delayed or waiting out a backoff) or a workflow's blocked one becomes
        ``cancelled`` now and its id leaves Redis (its workflow follows as for any end); a running one gets
        ``cancel_requested_at`` and its worker cancels the handler (and whatever
        its run ends with, the task is not retried).

        :raises TaskNotFoundError: no task has this id.
        :raises TaskFinishedError: it is completed, failed or cancelled already.
        """
        async with self.pg.transaction() as tx:
            row = await tx.tasks.lock_for_cancel(task_id)
            if row is None:
                raise TaskNotFoundError(str(task_id))
            status = row["status"]
            if status in (TaskStatus.QUEUED, TaskStatus.BLOCKED):
                changed = await tx.tasks.cancel_queued(task_id)
            elif status == TaskStatus.RUNNING:
                changed = await tx.tasks.request_cancel(task_id)
            else:
                raise TaskFinishedError(str(task_id), status)
            assert changed is not None  # the row is locked in the status just read
        await self.mirror([changed])  # a stray id left in Redis would only cost a failed claim
        return Cancelled(task_id, changed["status"], status)

    async def retry(self, task_id: uuid.UUID, priority: int | None = None, queue: str | None = None) -> Retried:
        """Move one failed or cancelled task back to queued, due now, with a fresh retry budget.

        Its next run is a new attempt (``attempts`` goes on counting); a failed task leaves
        its queue's DLQ mirror. ``priority`` and ``queue`` change the task when given; in another queue
        its limit keys are decided again for that queue (:meth:`LimitBook.keys_moved`): a limit scoped
        to the queue it leaves no longer holds it, one scoped to the queue it enters does.

        :raises TaskNotFoundError: no task has this id.
        :raises TaskStateError: it is queued, running or completed (only a failed or
            cancelled task is retried; a queued or running one is retried by itself).
        """
        if queue is not None:
            await self.learn()  # the limits of the queue it may enter, as they are now
        async with self.pg.transaction() as tx:
            row = await tx.tasks.lock_status(task_id)
            if row is None:
                raise TaskNotFoundError(str(task_id))
            if row["status"] not in RETRYABLE:
                raise TaskStateError(
                    str(task_id), row["status"], "retry", "only a failed or cancelled task can be retried"
                )
            [moved] = await tx.tasks.requeue([task_id], RETRYABLE, priority=priority, to_queue=queue)  # row locked
            limit_keys = moved["limit_keys"]
            if moved["queue"] != row["queue"]:
                limit_keys = await self._keys_moved(tx, task_id, moved["queue"])
        try:
            await self.redis.forget(row["queue"], str(task_id))
            await self.push([PushTarget(task_id, moved["queue"], moved["priority"], None, limit_keys)])
        except StoreError as exc:  # the reconciler pushes it; a stray DLQ entry is dropped by its sweep
            log.warning("redis_push_failed", tasks=1, error=str(exc))
        log.info("task_retried", task_id=str(task_id), queue=moved["queue"], priority=moved["priority"])
        return Retried(task_id, TaskStatus.QUEUED, moved["queue"], moved["priority"], row["status"])

    async def _keys_moved(self, tx: PgStore, task_id: uuid.UUID, queue: str) -> list[str] | None:
        """Decide again, and write, the limit keys of a task (its row locked in ``tx``) that moved into ``queue``."""
        found = await tx.tasks.get_limit_inputs(task_id)
        assert found is not None  # the row is locked
        try:
            payload = orjson.loads(found["payload"])
        except orjson.JSONDecodeError:  # its run fails on it anyway (ClaimedTask.defect); no payload key then
            payload = None
        before = found["limit_keys"]
        keys = self.limits.keys_moved(
            before, queue=queue, name=found["name"], tenant_id=found["tenant_id"], payload=payload
        )
        if keys != before:
            await tx.tasks.set_limit_keys(task_id, keys)
        return keys

    async def delete(self, task_id: uuid.UUID) -> str:
        """Delete one finished task (completed, failed or cancelled) and its runs.

        :returns: the status it had.
        :raises TaskNotFoundError: no task has this id.
        :raises TaskStateError: it is queued or running (cancel it first).
        """
        async with self.pg.transaction() as tx:
            row = await tx.tasks.lock_status(task_id)
            if row is None:
                raise TaskNotFoundError(str(task_id))
            if row["status"] in (TaskStatus.QUEUED, TaskStatus.RUNNING):
                raise TaskStateError(
                    str(task_id),
                    row["status"],
                    "delete",
                    "only a finished task can be deleted: cancel it first (POST /api/v1/tasks/{id}/cancel)",
                )
            deleted = await tx.tasks.delete_one_finished(task_id)
            assert deleted is not None  # the row is locked in a finished state
        if row["status"] == TaskStatus.FAILED:
            try:
                await self.redis.forget(row["queue"], str(task_id))
            except StoreError as exc:  # the reconciler's DLQ sweep drops the stray id
                log.warning("redis_forget_failed", task_id=str(task_id), error=str(exc))
        log.info("task_deleted", task_id=str(task_id), status=row["status"])
        return str(row["status"])

    async def replay(
        self,
        queue: str,
        count: int,
        override_priority: int | None = None,
        ids: Sequence[uuid.UUID] | None = None,
        tenant_id: str | None = None,
    ) -> list[str]:
        """Move up to ``count`` dead-lettered tasks back to ready, oldest first; or the given ``ids``.

        Each gets a fresh retry budget; its priority changes only when
        ``override_priority`` is given (as in the original platform). With ``ids``,
        ``count`` is ignored and the ids that are not dead-lettered in ``queue`` are left alone.
        With ``tenant_id``, only that tenant's tasks are replayed.

        :returns: the replayed task ids.
        """
        async with self.pg.transaction() as tx:
            if ids is None:
                ids = await tx.tasks.lock_oldest_failed(queue, count, tenant_id)
            rows = await tx.tasks.requeue(
                ids, [TaskStatus.FAILED], priority=override_priority, only_queue=queue, only_tenant=tenant_id
            )
        items = [(str(r["id"]), r["priority"]) for r in rows]
        try:
            await self.redis.replay(queue, items)
        except StoreError as exc:
            log.warning("redis_push_failed", tasks=len(items), error=str(exc))
        return [tid for tid, _ in items]
