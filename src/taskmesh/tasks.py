"""The one facade over the stores: enqueue, read, claim, finish, dead-letter, replay.

Every write commits in PostgreSQL first and only then touches Redis (design.md
principle 1); a Redis failure after the commit is logged and left to the
re-push service, never reported as a failed enqueue.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import orjson
import redis.exceptions
import structlog
from asyncpg.pool import PoolConnectionProxy

from taskmesh.errors import InvalidTaskError, TaskNotFoundError
from taskmesh.metrics import Metrics
from taskmesh.models import ClaimedTask, PushTarget, RunResult
from taskmesh.registry import Registry
from taskmesh.store import redis as rstore
from taskmesh.store.keys import Keys
from taskmesh.store.postgres import queries
from taskmesh.tracing import new_trace_id
from taskmesh.validation import TaskSpec

log = structlog.get_logger("taskmesh.tasks")

Connection = asyncpg.Connection | PoolConnectionProxy

REDIS_ERRORS = (redis.exceptions.RedisError, OSError)


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


class TaskFinishedError(TaskNotFoundError):
    """The task already finished (completed, failed or cancelled): nothing to cancel."""

    def __init__(self, task_id: uuid.UUID, status: str) -> None:
        super().__init__(str(task_id))
        self.status = status


@dataclass(frozen=True, slots=True)
class Enqueued:
    """Answer of :meth:`Tasks.enqueue`.

    ``created`` is ``False`` when the idempotency key named an existing task,
    whose id and current status are returned.
    """

    task_id: uuid.UUID
    status: str
    created: bool
    trace_id: str | None = None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def task_to_dict(row: asyncpg.Record) -> dict[str, Any]:
    """A ``tasks`` row in the API's shape (original field names: queue_name, dedup_key)."""
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "type": row["type"],
        "queue_name": row["queue"],
        "priority": row["priority"],
        "payload": orjson.loads(row["payload"]),
        "dedup_key": row["idempotency_key"],
        "max_retries": row["max_retries"],
        "retries": row["retries"],
        "attempts": row["attempts"],
        "status": row["status"],
        "run_at": _iso(row["run_at"]),
        "tenant_id": row["tenant_id"],
        "trace_id": row["trace_id"],
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
    }


def run_to_dict(row: asyncpg.Record) -> dict[str, Any]:
    """A ``task_runs`` row in the API's shape."""
    return {
        "id": str(row["id"]),
        "task_id": str(row["task_id"]),
        "attempt": row["attempt"],
        "status": row["status"],
        "worker_id": row["worker_id"],
        "claimed_at": _iso(row["claimed_at"]),
        "started_at": _iso(row["started_at"]),
        "finished_at": _iso(row["finished_at"]),
        "lease_expires_at": _iso(row["lease_expires_at"]),
        "next_retry_at": _iso(row["next_retry_at"]),
        "error": row["error"],
        "result": orjson.loads(row["result"]) if row["result"] is not None else None,
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
    }


def dump_json(value: Any, field: str) -> str:
    """Serialise ``value`` for a jsonb column.

    :raises InvalidTaskError: it is not JSON-serialisable.
    """
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        raise InvalidTaskError(field, f"is not JSON-serialisable: {exc}") from None


class Tasks:
    """Task operations over one PostgreSQL pool and one Redis client.

    :param registry: handlers, for per-name defaults (``max_retries``, ``queue``).
    :param default_max_retries: retries when neither request nor handler says.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        redis_client: rstore.Redis,
        keys: Keys,
        *,
        registry: Registry | None = None,
        default_max_retries: int = 3,
        metrics: Metrics | None = None,
    ) -> None:
        self.pool = pool
        self.redis = redis_client
        self.keys = keys
        self.registry = registry
        self.default_max_retries = default_max_retries
        self.metrics = metrics
        self._q = queries()

    async def enqueue(self, spec: TaskSpec) -> Enqueued:
        """Store a task (and its first run), then push its id to Redis.

        A repeated ``dedup_key`` returns the existing task and writes nothing,
        also under concurrent requests (the unique index decides).
        """
        [result] = await self.enqueue_many([spec], field_prefix="")
        return result

    def _prepare(self, spec: TaskSpec) -> tuple[str, int, str, datetime | None]:
        """Resolve a spec's defaults: ``(queue, max_retries, type, due_at)``."""
        handler = self.registry.get(spec.name) if self.registry else None
        max_retries = spec.max_retries
        if max_retries is None and handler is not None:
            max_retries = handler.max_retries
        if max_retries is None:
            max_retries = self.default_max_retries
        queue = spec.queue_name
        if "queue_name" not in spec.model_fields_set and handler and handler.queue:
            queue = handler.queue
        due_at = spec.due_at()
        task_type = "delayed" if due_at is not None else "immediate"
        return queue, max_retries, task_type, due_at

    async def enqueue_many(
        self, specs: Sequence[TaskSpec], *, field_prefix: str = "tasks[{i}].", task_type: str | None = None
    ) -> list[Enqueued]:
        """Store many tasks with one statement and push them with one Redis pipeline.

        :param task_type: overrides the ``type`` column (``cron`` for schedule fires);
            by default ``delayed`` when the spec has a delay, else ``immediate``.

        :returns: one :class:`Enqueued` per spec, in order; ``created=False``
            for an idempotency key that already existed (in the table or
            earlier in the same batch), with the existing task's id.
        :raises InvalidTaskError: a payload is not JSON-serialisable (nothing written).
        """
        async with self.pool.acquire() as conn:
            out, targets = await self.insert_many(conn, specs, field_prefix=field_prefix, task_type=task_type)
        await self.push(targets)
        return out

    async def insert_many(
        self,
        conn: Connection,
        specs: Sequence[TaskSpec],
        *,
        field_prefix: str = "tasks[{i}].",
        task_type: str | None = None,
    ) -> tuple[list[Enqueued], list[PushTarget]]:
        """The PostgreSQL half of :meth:`enqueue_many`, on ``conn`` (and in its transaction, if any).

        The caller pushes the returned targets with :meth:`push` once the
        transaction committed (design.md principle 1: PostgreSQL first).
        """
        if not specs:
            return [], []
        now = datetime.now().astimezone()
        ids = [uuid.uuid4() for _ in specs]
        traces = [s.trace_id or new_trace_id() for s in specs]  # every task can be followed in the logs
        prepared = [self._prepare(s) for s in specs]
        payloads = [dump_json(s.payload, field_prefix.format(i=i) + "payload") for i, s in enumerate(specs)]
        rows = await conn.fetch(
            self._q["task_insert_many"],
            ids,
            [s.name for s in specs],
            [task_type or p[2] for p in prepared],
            [p[0] for p in prepared],
            [s.priority for s in specs],
            payloads,
            [s.dedup_key for s in specs],
            [p[1] for p in prepared],
            [p[3] or now for p in prepared],
            [s.tenant_id for s in specs],
            traces,
        )
        created = {r["id"] for r in rows}
        existing: dict[str, tuple[uuid.UUID, str, str | None]] = {}
        missing_keys = [s.dedup_key for s, i in zip(specs, ids, strict=True) if i not in created and s.dedup_key]
        if missing_keys:
            for r in await conn.fetch(self._q["task_find_by_idempotency_keys"], missing_keys):
                existing[r["idempotency_key"]] = (r["id"], r["status"], r["trace_id"])
        out: list[Enqueued] = []
        targets: list[PushTarget] = []
        for spec, task_id, trace, (queue, _, _, due_at) in zip(specs, ids, traces, prepared, strict=True):
            if task_id in created:
                out.append(Enqueued(task_id, "queued", created=True, trace_id=trace))
                targets.append(PushTarget(task_id, queue, spec.priority, due_at))
                if self.metrics:
                    self.metrics.tasks_created.labels(queue).inc()
            else:
                found = existing.get(spec.dedup_key or "")  # only a key conflict inserts nothing
                if found is None:  # deleted between the two statements: vanishingly rare, say so
                    raise TaskNotFoundError(f"task with dedup_key {spec.dedup_key!r} vanished")
                found_id, status, found_trace = found
                out.append(Enqueued(found_id, status, created=False, trace_id=found_trace))
                if self.metrics:
                    self.metrics.tasks_deduplicated.labels(queue).inc()
        return out, targets

    async def push(self, targets: Sequence[PushTarget]) -> None:
        """Push committed tasks' ids to Redis; a failure is logged and left to the reconciler."""
        if targets:
            await self._push(targets)

    async def _push(self, targets: Sequence[PushTarget]) -> None:
        try:
            await rstore.push(self.redis, self.keys, targets)
        except REDIS_ERRORS as exc:
            if self.metrics:
                self.metrics.redis_push_failures.inc()
            log.warning("redis_push_failed", tasks=len(targets), error=str(exc))

    async def get(self, task_id: uuid.UUID) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The task and its latest run.

        :raises TaskNotFoundError: no task has this id.
        """
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(self._q["task_get"], task_id)
            if row is None:
                raise TaskNotFoundError(str(task_id))
            run = await conn.fetchrow(self._q["run_get_latest"], task_id)
        return task_to_dict(row), run_to_dict(run) if run else None

    async def runs(self, task_id: uuid.UUID) -> list[dict[str, Any]]:
        """Every run of a task, by attempt.

        :raises TaskNotFoundError: no task has this id.
        """
        async with self.pool.acquire() as conn:
            if await conn.fetchrow(self._q["task_get"], task_id) is None:
                raise TaskNotFoundError(str(task_id))
            rows = await conn.fetch(self._q["run_list_by_task"], task_id)
        return [run_to_dict(r) for r in rows]

    async def dead_letters(self, queue: str, count: int) -> list[dict[str, Any]]:
        """Up to ``count`` dead-lettered tasks of ``queue``, oldest first."""
        rows = await self.pool.fetch(self._q["task_list_failed"], queue, count)
        return [task_to_dict(r) for r in rows]

    async def replay(self, queue: str, count: int, override_priority: int | None = None) -> list[str]:
        """Move up to ``count`` dead-lettered tasks back to ready, oldest first.

        Each gets a fresh retry budget; its priority changes only when
        ``override_priority`` is given (as in the original platform).
        :returns: the replayed task ids.
        """
        rows = await self.pool.fetch(self._q["task_replay_many"], queue, count, override_priority)
        items = [(str(r["id"]), r["priority"]) for r in rows]
        try:
            await rstore.replay(self.redis, self.keys, queue, items)
        except REDIS_ERRORS as exc:
            log.warning("redis_push_failed", tasks=len(items), error=str(exc))
        return [tid for tid, _ in items]

    async def claim(self, queue: str, ids: Sequence[str], worker_id: str, lease_seconds: float) -> list[ClaimedTask]:
        """Claim popped ids in one conditional UPDATE (design.md principle 3).

        Ids that are no longer queued (claimed elsewhere, duplicates) are
        dropped quietly.
        """
        uuids = []
        for raw in ids:
            try:
                uuids.append(uuid.UUID(raw))
            except ValueError:
                log.warning("redis_id_malformed", queue=queue, value=raw[:64])
        if not uuids:
            return []
        rows = await self.pool.fetch(self._q["task_claim_many"], uuids, queue, worker_id, lease_seconds)
        if len(rows) < len(uuids):
            await self._return_not_due(uuids, {r["id"] for r in rows})
        return [
            ClaimedTask(
                task_id=r["id"],
                run_id=r["run_id"],
                name=r["name"],
                queue=r["queue"],
                priority=r["priority"],
                payload=orjson.loads(r["payload"]),
                attempt=r["attempts"],
                retries=r["retries"],
                max_retries=r["max_retries"],
                idempotency_key=r["idempotency_key"],
                trace_id=r["trace_id"],
                tenant_id=r["tenant_id"],
                ready_at=r["run_at"].timestamp(),
            )
            for r in rows
        ]

    async def _return_not_due(self, popped: Sequence[uuid.UUID], claimed: set[uuid.UUID]) -> None:
        """Put popped-but-not-due ids back into the delayed set, so that they run when due.

        Only queued tasks whose ``run_at`` is still ahead (by PostgreSQL's clock)
        qualify: an id pushed early by a race, or moved by an instance whose clock
        runs ahead. Everything else that was not claimed is dropped quietly.
        """
        unclaimed = [i for i in popped if i not in claimed]
        rows = await self.pool.fetch(self._q["task_list_not_due"], unclaimed)
        if rows:
            await self._push([PushTarget(r["id"], r["queue"], r["priority"], r["run_at"]) for r in rows])

    async def finish(self, results: Sequence[RunResult], worker_id: str) -> int:
        """Write a batch of run results in one statement, then update Redis.

        Retried tasks go to their queue's delayed set, dead-lettered ones to its
        DLQ mirror, interrupted ones back to ready.
        :returns: results written (a fenced-out late result is not).
        :raises asyncpg.PostgresError, OSError: Postgres failed; nothing was written.
        """
        if not results:
            return 0
        rows = await self.pool.fetch(
            self._q["run_finish_many"],
            [r.task.run_id for r in results],
            [r.task.task_id for r in results],
            [r.outcome.value for r in results],
            [r.error for r in results],
            [r.result for r in results],
            [float(r.delay_seconds) for r in results],
            worker_id,
        )
        await self._after_finish(rows)
        if len(rows) < len(results):
            late = len(results) - len(rows)
            if self.metrics:
                self.metrics.late_results.inc(late)
            written = {row["id"] for row in rows}
            for r in results:
                if r.task.task_id not in written:
                    log.warning(
                        "late_result_dropped",
                        task_id=str(r.task.task_id),
                        task_name=r.task.name,
                        queue=r.task.queue,
                        run_id=str(r.task.run_id),
                        attempt=r.task.attempt,
                        trace_id=r.task.trace_id,
                        outcome=r.outcome.value,
                        worker_id=worker_id,
                    )
        return len(rows)

    async def _after_finish(self, rows: Sequence[asyncpg.Record]) -> None:
        """Redis side of finished runs: retries to delayed (or ready), failures to the DLQ mirror."""
        pushes: list[PushTarget] = []
        dead: dict[str, list[str]] = defaultdict(list)
        for row in rows:
            if row["status"] == "queued":
                pushes.append(PushTarget(row["id"], row["queue"], row["priority"], row["run_at"]))
            elif row["status"] == "failed":
                dead[row["queue"]].append(str(row["id"]))
        try:
            if pushes:
                await rstore.push_ready_or_delayed(self.redis, self.keys, pushes)
            for queue, ids in dead.items():
                await rstore.dead_letter(self.redis, self.keys, queue, ids)
        except REDIS_ERRORS as exc:  # Postgres has it; the reconciler repairs Redis
            log.warning("redis_push_failed", tasks=len(pushes), error=str(exc))

    async def cancel(self, task_id: uuid.UUID) -> Cancelled:
        """Cancel a task (issue 3).

        A queued task (ready, delayed or waiting out a backoff) becomes
        ``cancelled`` now and its id leaves Redis; a running one gets
        ``cancel_requested_at`` and its worker cancels the handler.
        :raises TaskNotFoundError: no task has this id.
        :raises TaskFinishedError: it is completed, failed or cancelled already.
        """
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(self._q["task_lock_for_cancel"], task_id)
            if row is None:
                raise TaskNotFoundError(str(task_id))
            status = row["status"]
            if status == "queued":
                await conn.execute(self._q["task_cancel_queued"], task_id)
            elif status == "running":
                await conn.execute(self._q["task_request_cancel"], task_id)
            else:
                raise TaskFinishedError(task_id, status)
        if status == "queued":
            try:
                await rstore.forget(self.redis, self.keys, row["queue"], str(task_id))
            except REDIS_ERRORS as exc:  # a stray id only costs a failed claim
                log.warning("redis_forget_failed", task_id=str(task_id), error=str(exc))
            return Cancelled(task_id, "cancelled", status)
        return Cancelled(task_id, "running", status)

    async def heartbeat(
        self,
        worker_id: str,
        host: str,
        pid: int,
        queues: dict[str, int],
        version: str,
        state: str,
        lease_seconds: float,
    ) -> list[uuid.UUID]:
        """Register or refresh a worker and extend its running runs' leases (one statement).

        :returns: ids of its running tasks whose cancellation was requested.
        """
        rows = await self.pool.fetch(
            self._q["worker_heartbeat"],
            worker_id,
            host,
            pid,
            orjson.dumps(queues).decode(),
            version,
            state,
            lease_seconds,
        )
        return [r["id"] for r in rows]

    async def deregister(self, worker_id: str) -> None:
        """Mark a worker stopped."""
        await self.pool.execute(self._q["worker_deregister"], worker_id)

    async def workers(self, limit: int = 100) -> list[dict[str, Any]]:
        """Registered instances, live first, with their in-flight run counts."""
        rows = await self.pool.fetch(self._q["worker_list"], limit)
        return [
            {
                "id": r["id"],
                "host": r["host"],
                "pid": r["pid"],
                "queues": orjson.loads(r["queues"]),
                "version": r["version"],
                "state": r["state"],
                "started_at": _iso(r["started_at"]),
                "heartbeat_at": _iso(r["heartbeat_at"]),
                "stopped_at": _iso(r["stopped_at"]),
                "in_flight": r["in_flight"],
            }
            for r in rows
        ]

    async def reclaim_expired(self, worker_stale_seconds: float, limit: int = 500) -> dict[str, int]:
        """End runs whose lease expired (see ``run_reclaim_expired``) and update Redis.

        :returns: counts by the task's new status (``queued``, ``failed``, ``cancelled``).
        """
        rows = await self.pool.fetch(self._q["run_reclaim_expired"], worker_stale_seconds, limit)
        await self._after_finish(rows)
        counts: dict[str, int] = defaultdict(int)
        for row in rows:
            counts[row["status"]] += 1
            if self.metrics is not None:
                self.metrics.run_finished(row["queue"], row["name"], "lease_expired", None)
        return dict(counts)

    async def mark_lost_workers(self, silent_seconds: float, forget_after_seconds: float) -> int:
        """Mark silent workers lost and forget long-gone ones; returns how many became lost."""
        async with self.pool.acquire() as conn:
            lost = await conn.fetch(self._q["worker_mark_lost"], silent_seconds)
            await conn.execute(self._q["worker_delete_old"], forget_after_seconds)
        return len(lost)

    async def queued_page(self, queues: Sequence[str], after: uuid.UUID, limit: int) -> list[PushTarget]:
        """Queued tasks of ``queues`` with id greater than ``after``, by id (a resync page)."""
        rows = await self.pool.fetch(self._q["task_list_queued_page"], list(queues), after, limit)
        return [PushTarget(r["id"], r["queue"], r["priority"], r["run_at"]) for r in rows]

    async def delete_finished(self, status: str, older_than_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` tasks in ``status`` older than ``older_than_seconds``; returns how many."""
        result = await self.pool.execute(self._q["task_delete_finished"], status, older_than_seconds, limit)
        return int(result.split()[-1])

    async def queued_counts(self, queues: Sequence[str]) -> dict[str, int]:
        """Queued tasks per queue (missing queues have none)."""
        rows = await self.pool.fetch(self._q["task_count_queued"], list(queues))
        return {r["queue"]: r["n"] for r in rows}

    async def failed_ids(self, queue: str, limit: int) -> list[str]:
        """Ids of the dead-lettered tasks of ``queue``, oldest first."""
        return [str(r["id"]) for r in await self.pool.fetch(self._q["task_list_failed_ids"], queue, limit)]

    async def stale_queued(self, queues: Sequence[str], min_age_seconds: float, limit: int) -> list[PushTarget]:
        """Queued tasks older than ``min_age_seconds`` (candidates for a re-push)."""
        rows = await self.pool.fetch(self._q["task_list_queued_stale"], list(queues), min_age_seconds, limit)
        return [PushTarget(r["id"], r["queue"], r["priority"], r["run_at"]) for r in rows]
