"""Typed calls of the ``task_*`` and ``run_*`` blocks of ``queries.sql`` (one method per block).

Each method names its block, takes plain values and returns asyncpg records or
plain values; a failure raises :class:`~taskmesh.errors.StoreError` naming the
block. Decoding rows into the API's shape is ``taskmesh.tasks.records``'s job.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from taskmesh.store.sql import Queries
from taskmesh.tasks.states import FINISHED_TASK_STATUSES

DEAD_LETTER_DELTAS_FOLDED = 10_000
"""Most dead-letter count deltas one compaction statement folds."""
DEAD_LETTER_FOLD_ROUNDS = 10
"""Most compaction statements the sampler runs before each read (100,000 deltas a tick)."""


COPY_COLUMNS = ("id", "name", "type", "queue", "priority", "payload", "max_retries", "tenant_id", "trace_id", "status")
"""The columns of :meth:`TaskQueries.copy_in`'s rows, in order (``status`` is always ``queued``)."""


class TaskQueries(Queries):
    """Queries on ``tasks`` and ``task_runs``."""

    async def insert_many(self, columns: Sequence[Sequence[Any]]) -> list[asyncpg.Record]:
        """``task_insert_many``: the rows inserted (``id``, ``run_at``, ``delayed``); repeats insert nothing.

        :param columns: the seventeen arrays of an enqueue plan
            (:meth:`~taskmesh.tasks.enqueue_plan.TaskRows.columns`).
        """
        return await self._fetch("task_insert_many", *[list(c) for c in columns])

    async def copy_in(self, rows: AsyncIterable[bytes]) -> None:
        """Copy immediate tasks without a dedup key into ``tasks`` (``COPY``; cheaper per row than INSERT).

        Their ``run_at``, ``created_at`` and ``updated_at`` are PostgreSQL's ``now()`` (the
        columns' defaults, migration 0019), as an INSERT's are; no row can conflict.

        :param rows: chunks of rows in ``COPY``'s text format, each of the columns
            :data:`COPY_COLUMNS` (``copy_enqueue._line`` writes one), sent as they come.
        :raises StoreError: PostgreSQL failed; the statement wrote nothing.
        """
        await self._copy("task_copy_in", "tasks", COPY_COLUMNS, rows)

    async def find_by_idempotency_keys(self, keys: Sequence[tuple[str, str]]) -> list[asyncpg.Record]:
        """``task_find_by_idempotency_keys``: ``idempotency_key, tenant, id, status, trace_id`` of the tasks of
        ``(dedup key, tenant)`` pairs (tenant ``''``: none)."""
        return await self._fetch("task_find_by_idempotency_keys", [k for k, _ in keys], [t for _, t in keys])

    async def get_with_latest_run(self, task_id: uuid.UUID) -> asyncpg.Record | None:
        """``task_get_with_latest_run``: the task's columns and its latest run's as ``run_*``; None if absent."""
        return await self._fetchrow("task_get_with_latest_run", task_id)

    async def exists(self, task_id: uuid.UUID) -> bool:
        """``task_exists``."""
        return bool(await self._fetchval("task_exists", task_id))

    async def lock_tenants(self, tenant_ids: Sequence[str]) -> str:
        """``task_lock_tenants``: the tenants' advisory locks until the transaction ends (call inside one).

        :returns: the transaction's isolation level (``read committed``, ``repeatable read``, ``serializable``).
        """
        row = await self._fetchrow("task_lock_tenants", list(tenant_ids), "transaction_isolation")
        assert row is not None  # an aggregate answers one row
        return str(row["isolation"])

    async def count_open_of_tenants(self, tenant_ids: Sequence[str], most: Sequence[int]) -> dict[str, int]:
        """``task_count_open_of_tenants``: each tenant's queued or running tasks, at most its ``most``."""
        rows = await self._fetch("task_count_open_of_tenants", list(tenant_ids), list(most))
        return {r["tenant"]: r["open"] for r in rows}

    async def owner(self, task_id: uuid.UUID) -> asyncpg.Record | None:
        """``task_owner``: ``tenant_id, queue`` of the task (``None``: no task has this id)."""
        return await self._fetchrow("task_owner", task_id)

    async def runs(self, task_id: uuid.UUID) -> list[asyncpg.Record]:
        """``run_list_by_task``: every run of a task, by attempt."""
        return await self._fetch("run_list_by_task", task_id)

    async def claim_many(
        self, ids: Sequence[uuid.UUID], queue: str, worker_id: str, lease_seconds: float
    ) -> list[asyncpg.Record]:
        """``task_claim_many``: the claimed tasks with their new ``run_id`` (docs/internals/design.md principle 3)."""
        return await self._fetch("task_claim_many", list(ids), queue, worker_id, lease_seconds)

    async def list_unclaimed_queued(self, ids: Sequence[uuid.UUID]) -> list[asyncpg.Record]:
        """``task_list_unclaimed_queued``: of ``ids``, the tasks still queued (``delayed``: not due yet)."""
        return await self._fetch("task_list_unclaimed_queued", list(ids))

    async def finish_many(
        self,
        run_ids: Sequence[uuid.UUID],
        task_ids: Sequence[uuid.UUID],
        outcomes: Sequence[str],
        errors: Sequence[str | None],
        results: Sequence[str | None],
        delays: Sequence[float],
        tracebacks: Sequence[str | None],
        worker_id: str,
    ) -> list[asyncpg.Record]:
        """``run_finish_many``: the tasks written (``id, queue, priority, status, run_at``); fenced-out runs are not."""
        return await self._fetch(
            "run_finish_many",
            list(run_ids),
            list(task_ids),
            list(outcomes),
            list(errors),
            list(results),
            list(delays),
            list(tracebacks),
            worker_id,
        )

    async def reclaim_expired(self, stale_seconds: float, limit: int) -> list[asyncpg.Record]:
        """``run_reclaim_expired``: tasks of the runs ended (``id, name, queue, priority, status, run_at``)."""
        return await self._fetch("run_reclaim_expired", stale_seconds, limit)

    async def hand_back_by_worker(self, worker_id: str, error: str, delay_seconds: float) -> list[asyncpg.Record]:
        """``run_hand_back_by_worker``: the transition rows (``id, queue, priority, status, run_at``) of the tasks
        handed back."""
        return await self._fetch("run_hand_back_by_worker", worker_id, error, delay_seconds)

    async def lock_for_cancel(self, task_id: uuid.UUID) -> asyncpg.Record | None:
        """``task_lock_for_cancel`` (inside a transaction): ``id, queue, status``, row locked."""
        return await self._fetchrow("task_lock_for_cancel", task_id)

    async def cancel_queued(self, task_id: uuid.UUID) -> asyncpg.Record | None:
        """``task_cancel_queued``: the task's transition row (``id, queue, priority, status, run_at``), ``None``
        when it was not queued or blocked."""
        return await self._fetchrow("task_cancel_queued", task_id)

    async def request_cancel(self, task_id: uuid.UUID) -> asyncpg.Record | None:
        """``task_request_cancel``: the running task's row (status still ``running``), ``None`` when it was not."""
        return await self._fetchrow("task_request_cancel", task_id)

    async def list_failed_with_latest_run(
        self, queue: str, limit: int, tenant_id: str | None = None
    ) -> list[asyncpg.Record]:
        """``task_list_failed_with_latest_run``: the queue's dead-lettered tasks (of ``tenant_id`` when given),
        oldest first.

        :returns: the task columns but ``payload``, and the latest run's as ``run_attempt``,
            ``run_status``, ``run_error``, ``run_finished_at`` (``None`` without a run).
        """
        return await self._fetch("task_list_failed_with_latest_run", queue, limit, tenant_id)

    async def lock_status(self, task_id: uuid.UUID) -> asyncpg.Record | None:
        """``task_lock_status``: ``status, queue`` with the row locked; ``None`` when no task has the id."""
        return await self._fetchrow("task_lock_status", task_id)

    async def get_limit_inputs(self, task_id: uuid.UUID) -> asyncpg.Record | None:
        """``task_get_limit_inputs``: ``name, tenant_id, payload`` (JSON text) ``, limit_keys`` of a task;
        ``None`` when no task has the id."""
        return await self._fetchrow("task_get_limit_inputs", task_id)

    async def set_limit_keys(self, task_id: uuid.UUID, limit_keys: Sequence[str] | None) -> None:
        """``task_set_limit_keys``: the limit keys the task holds from now on (``None``: none)."""
        await self._execute("task_set_limit_keys", task_id, None if limit_keys is None else list(limit_keys))

    async def delete_one_finished(self, task_id: uuid.UUID) -> asyncpg.Record | None:
        """``task_delete_one_finished``: ``status, queue`` of the deleted task, ``None`` if it was not finished."""
        return await self._fetchrow("task_delete_one_finished", task_id)

    async def requeue(
        self,
        ids: Sequence[uuid.UUID],
        from_statuses: Sequence[str],
        *,
        priority: int | None = None,
        to_queue: str | None = None,
        only_queue: str | None = None,
        only_tenant: str | None = None,
    ) -> list[asyncpg.Record]:
        """``task_requeue``: ``id, queue, priority`` of the tasks of ``ids`` in ``from_statuses`` now queued.

        :param priority: a new priority (``None``: kept).
        :param to_queue: a new queue (``None``: kept).
        :param only_queue: act only on tasks of this queue.
        :param only_tenant: act only on tasks of this tenant.
        """
        return await self._fetch(
            "task_requeue", list(ids), list(from_statuses), priority, to_queue, only_queue, only_tenant
        )

    async def lock_oldest_failed(self, queue: str, count: int, tenant_id: str | None = None) -> list[uuid.UUID]:
        """``task_lock_oldest_failed``: ids of the queue's oldest dead-lettered tasks (of ``tenant_id`` when
        given), locked (in a transaction)."""
        return [r["id"] for r in await self._fetch("task_lock_oldest_failed", queue, count, tenant_id)]

    async def debounce_many(self, columns: Sequence[Sequence[Any]]) -> list[asyncpg.Record]:
        """``task_debounce_many``: create or replace debounced tasks, given as its thirteen arrays; per task
        ``id, queue, priority, run_at, delayed, inserted, debounce_key, tenant_id, trace_id, limit_keys``.

        :raises StoreError: PostgreSQL failed; nothing was written.
        """
        return await self._fetch("task_debounce_many", *columns)

    async def list_running_limited(self, queue: str) -> list[asyncpg.Record]:
        """``task_list_running_limited``: ``id, limit_keys, until_ms`` of the running tasks holding limit keys."""
        return await self._fetch("task_list_running_limited", queue)

    async def list_queued_after(
        self,
        queue: str,
        after_run_at: datetime | None,
        after_id: uuid.UUID | None,
        min_age_seconds: float,
        limit: int,
    ) -> list[asyncpg.Record]:
        """``task_list_queued_after``: ``id, queue, priority, run_at, limit_keys`` after the cursor, in (run_at, id)
        order."""
        return await self._fetch("task_list_queued_after", queue, after_run_at, after_id, min_age_seconds, limit)

    async def list_failed_ids(self, queue: str, limit: int) -> list[tuple[uuid.UUID, int]]:
        """``task_list_failed_ids``: ``(id, failed_at_ms)`` of the queue's dead-lettered tasks, oldest first."""
        return [(r["id"], r["failed_at_ms"]) for r in await self._fetch("task_list_failed_ids", queue, limit)]

    async def count_queued(self, queues: Sequence[str]) -> dict[str, int]:
        """``task_count_queued``: queued tasks per queue (queues without any are absent)."""
        return {r["queue"]: r["n"] for r in await self._fetch("task_count_queued", list(queues))}

    async def delete_finished(self, status: str, older_than_seconds: float, limit: int) -> int:
        """``task_delete_completed`` / ``_cancelled`` / ``_failed``: how many were deleted.

        :raises ValueError: ``status`` is not a finished status.
        """
        if status not in FINISHED_TASK_STATUSES:
            raise ValueError(f"not a finished status: {status!r}")
        result = await self._execute(f"task_delete_{status}", older_than_seconds, limit)
        return int(result.split()[-1])

    async def status(self, task_id: uuid.UUID) -> str | None:
        """``task_status``: the task's status, or ``None`` when it does not exist."""
        value: str | None = await self._fetchval("task_status", task_id)
        return value

    async def sample_running_by_queue(self, queues: Sequence[str]) -> dict[str, int]:
        """``task_sample_running_by_queue``."""
        return {r["queue"]: r["n"] for r in await self._fetch("task_sample_running_by_queue", list(queues))}

    async def sample_failed_by_queue(self, queues: Sequence[str]) -> dict[str, int]:
        """``task_sample_failed_by_queue``: dead-lettered tasks per queue (absent: none), read from the counts."""
        return {r["queue"]: r["n"] for r in await self._fetch("task_sample_failed_by_queue", list(queues))}

    async def compact_dead_letter_counts(self, most: int = DEAD_LETTER_DELTAS_FOLDED, rounds: int = 1) -> int:
        """``dead_letter_count_compact``: fold deltas into the per-queue counts, ``most`` per statement
        (a transaction of its own), until fewer are left or ``rounds`` statements ran; returns how many.

        A read adds every delta not folded yet, so after a mass failure (a million tasks
        dead-lettered at once) the sampler folds several batches a tick.
        """
        folded = 0
        for _ in range(rounds):
            n = int(await self._fetchval("dead_letter_count_compact", most))
            folded += n
            if n < most:
                break
        return folded

    async def count_queued_unserved(self, served: Sequence[str], limit: int) -> list[asyncpg.Record]:
        """``task_count_queued_unserved``: ``queue, queued, ready`` of queues not in ``served`` (at most ``limit``)."""
        return await self._fetch("task_count_queued_unserved", list(served), limit)

    async def sample_oldest_ready_age(self, queue: str) -> float:
        """``task_sample_oldest_ready_age``: seconds, 0 when nothing is due."""
        return float(await self._fetchval("task_sample_oldest_ready_age", queue))
