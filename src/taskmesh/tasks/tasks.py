"""The one facade for a task's life: enqueue, read, claim, finish, cancel, dead-letter, replay.

Every write commits in PostgreSQL first and only then touches Redis (docs/internals/design.md
principle 1); a Redis failure after the commit is logged
(``redis_push_failed``) and left to the reconciler, never reported as a failed
enqueue. Store failures come up as :class:`~taskmesh.errors.StoreError`.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from taskmesh.errors import InvalidTaskError, StoreError, TaskNotFoundError
from taskmesh.limits import live, waiting
from taskmesh.limits.book import FAIR_MARK, LimitBook, limit_name
from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import Metrics
from taskmesh.security import audit
from taskmesh.store import PgStore, RedisStore
from taskmesh.store.redis_limits import Release
from taskmesh.tasks import debounce, enqueue_plan
from taskmesh.tasks.actions import TaskActions
from taskmesh.tasks.advertised import AdvertisedHandlers, Advertisement
from taskmesh.tasks.copy_enqueue import COPY_MIN_TASKS, ReadyTargets, copy_many, copyable, copyable_mapping
from taskmesh.tasks.models import ClaimedTask, Enqueued, PushTarget, RunResult
from taskmesh.tasks.queued_quota import QueuedLimits, created_by_tenant
from taskmesh.tasks.records import run_to_dict as _run_to_dict
from taskmesh.tasks.records import task_and_latest_run, task_summary_to_dict
from taskmesh.tasks.registry import Handler, Registry
from taskmesh.tasks.states import FINISHED_TASK_STATUSES, TaskStatus, TaskType
from taskmesh.tasks.validation import MAX_DELAY_SECONDS, TaskSpec, parse_task_specs
from taskmesh.workflows import inputs

log = get_logger("taskmesh.tasks.tasks")

DEFAULT_QUEUE = "default"
"""The queue of a task whose request and handler name none."""
ENQUEUED_CHANNEL = "taskmesh_enqueued"
"""PostgreSQL channel of transactionally enqueued task ids (space-separated), sent at the caller's commit."""
ENQUEUED_IDS_PER_NOTIFY = 200
"""Ids per notification (a payload must stay under PostgreSQL's 8,000 bytes)."""


def _epoch(value: datetime) -> float | None:
    """Seconds since the epoch, or ``None`` for an instant Python cannot place (``-infinity``)."""
    try:
        return value.timestamp() if value.tzinfo is not None else None
    except (ValueError, OverflowError):
        return None


class Tasks(TaskActions):
    """Task operations over the two stores.

    :param pg: the PostgreSQL store.
    :param redis: the Redis store.
    :param registry: handlers, for per-name defaults (``max_retries``, ``queue``).
    :param default_max_retries: retries when neither request nor handler says.
    :param metrics: the instance's metrics (``None`` in the client and the CLI).
    :param max_delay_seconds: how far ahead a task may be delayed (the ``max_delay_seconds`` setting);
        what the API and the client validate with (:func:`~taskmesh.tasks.validation.parse_task_spec`).
    :param queued_limits: tenants' ``max_queued`` quotas, held exactly by every create
        (``queued_quota.py``); ``None``: none.
    :param advertised: what live instances advertise about their handlers, for names this process
        has no handler of (``advertised.py``); default a new reader.
    :param workflow_parents_max_bytes: most bytes of deps' results one task of a workflow is handed
        (the ``workflow_parents_max_bytes`` setting).
    :param limits: the task limits in force (``limits/book.py``): the limit keys each created task holds,
        and the numbers a run's end gives its slots back under; default none.
    """

    def __init__(
        self,
        pg: PgStore,
        redis: RedisStore,
        *,
        registry: Registry | None = None,
        default_max_retries: int = 3,
        metrics: Metrics | None = None,
        max_delay_seconds: float = MAX_DELAY_SECONDS,
        queued_limits: QueuedLimits | None = None,
        advertised: AdvertisedHandlers | None = None,
        workflow_parents_max_bytes: int = inputs.PARENTS_MAX_BYTES,
        limits: LimitBook | None = None,
    ) -> None:
        self.pg = pg
        self.redis = redis
        self.registry = registry
        self.default_max_retries = default_max_retries
        self.metrics = metrics
        self.max_delay_seconds = max_delay_seconds
        self.queued_limits = queued_limits
        self.advertised = advertised if advertised is not None else AdvertisedHandlers()
        self.workflow_parents_max_bytes = workflow_parents_max_bytes
        self.limits = limits if limits is not None else LimitBook()
        redis.fair_args = self.limits.fair_args  # pushes of a queue with fair shares are scored by their keys
        redis.priority_step = self.limits.priority_step  # a queue with priority aging scores by its own step

    # -- enqueue ---------------------------------------------------------------

    async def enqueue(self, spec: TaskSpec) -> Enqueued:
        """Store a task (and its first run), then push its id to Redis.

        A repeated ``dedup_key`` returns the existing task and writes nothing,
        also under concurrent requests (the unique index decides).

        :raises InvalidTaskError: the payload is not JSON-serialisable.
        :raises StoreError: PostgreSQL failed; nothing was written.
        """
        [result] = await self.enqueue_many([spec], field_prefix="")
        return result

    async def enqueue_many(
        self,
        specs: Sequence[TaskSpec],
        *,
        field_prefix: str = "tasks[{i}].",
        task_type: str | None = None,
        quota: bool = True,
    ) -> list[Enqueued]:
        """Store many tasks in one transaction (see :meth:`insert_many`) and push them to Redis at once.

        :param task_type: overrides the ``type`` column (``cron`` for schedule fires);
            by default ``delayed`` when the spec has a delay, else ``immediate``.
        :param quota: hold the tenants' ``max_queued`` quotas (:attr:`queued_limits`).
        :returns: one :class:`Enqueued` per spec, in order; ``created=False``
            for an idempotency key that already existed (in the table or
            earlier in the same batch), with the existing task's id.
        :raises InvalidTaskError: a payload is not JSON-serialisable (nothing written).
        :raises QuotaExceededError: a tenant would hold more than its ``max_queued`` (nothing written).
        :raises StoreError: PostgreSQL failed; nothing was written.
        """
        await self.learn()  # before the transaction: a read inside would take a second connection
        limited = quota and self.queued_limits is not None and self.queued_limits.limited(s.tenant_id for s in specs)
        # A quota is counted and held in the transaction of the insert; without one a lone statement commits alone.
        async with self.pg.atomic() if limited else self.pg.changing() as pg:
            out, targets = await self.insert_many(
                pg, specs, field_prefix=field_prefix, task_type=task_type, quota=limited
            )
        await self.push(targets)
        return out

    async def enqueue_mappings(self, items: Sequence[dict[str, Any]]) -> list[Enqueued]:
        """Validate tasks in the API's field names and enqueue them, as :meth:`enqueue_many` of
        :func:`~taskmesh.tasks.validation.parse_task_specs`.

        A bulk that will be copied is validated a slice at a time while PostgreSQL copies the
        slices before (``copy_enqueue.py``), not all before the first row is sent.

        :raises InvalidTaskError: the first invalid task, its field prefixed with ``tasks[i].``;
            nothing is written then.
        :raises StoreError: PostgreSQL failed; nothing was written.
        """
        await self.learn()
        if len(items) < COPY_MIN_TASKS or self.limits or not all(copyable_mapping(item) for item in items):
            return await self.enqueue_many(self.parse(items))
        async with self.pg.changing() as pg:
            out, targets, tenants = await copy_many(
                self,
                pg,
                len(items),
                lambda a, b: self.parse(items[a:b], first=a),
                "tasks[{i}].",
                None,
                quota=self.queued_limits is not None,
            )
            _note_created(out, tenants)
        await self.push(targets)
        return out

    def parse(self, items: Sequence[Any], *, first: int = 0) -> list[TaskSpec]:
        """:func:`~taskmesh.tasks.validation.parse_task_specs` with this facade's ``max_delay_seconds``."""
        return parse_task_specs(items, first=first, max_delay_seconds=self.max_delay_seconds)

    async def enqueue_in_transaction(self, connection: asyncpg.Connection, specs: Sequence[TaskSpec]) -> list[Enqueued]:
        """Store tasks inside the caller's own transaction on ``connection`` (transactional enqueue).

        Rolled back, the tasks never existed. Committed, PostgreSQL delivers a notification
        on :data:`ENQUEUED_CHANNEL` naming them, and every instance's ``enqueued_listener``
        pushes them into Redis at once; the reconciler finds any it missed. Nothing here
        touches Redis: the commit is the caller's.

        :raises InvalidTaskError: a task is invalid (``tasks[i].…``), or ``connection`` is not
            inside a transaction (``connection: must be inside a transaction``), or not a READ
            COMMITTED one while a tenant's ``max_queued`` quota applies.
        :raises QuotaExceededError: a tenant would hold more than its ``max_queued``; the caller's
            transaction must then be rolled back.
        :raises StoreError: PostgreSQL failed (the caller's transaction is then aborted).
        """
        if not connection.is_in_transaction():
            raise InvalidTaskError(
                "connection", "must be inside a transaction (async with connection.transaction(): ...)"
            )
        await self.learn()
        pg = self.pg.on(connection)
        # Never COPY here: a COPY encodes with the connection's codecs, and an application's
        # connection may have its own for jsonb; the INSERT sends payloads as text.
        out, targets = await self.insert_many(pg, specs, copy=False, quota=True)
        ids = [str(t.task_id) for t in targets]
        for start in range(0, len(ids), ENQUEUED_IDS_PER_NOTIFY):
            await pg.notify(ENQUEUED_CHANNEL, " ".join(ids[start : start + ENQUEUED_IDS_PER_NOTIFY]))
        return out

    async def push_enqueued(self, task_ids: Sequence[uuid.UUID]) -> int:
        """Push the given tasks that are still queued (a transactional enqueue's, once committed).

        :returns: how many were pushed.
        :raises StoreError: a store failed.
        """
        rows = await self.pg.tasks.list_unclaimed_queued(task_ids)
        # PostgreSQL's own word on whether each is due (its clock): an estimate of that clock a little
        # behind would send a task due now through the delayed set, a mover's tick later.
        await self.redis.push_ready_or_delayed(
            [PushTarget(r["id"], r["queue"], r["priority"], _due(r), r["limit_keys"]) for r in rows]
        )
        return len(rows)

    async def learn(self) -> None:
        """Read what live instances advertise about their handlers, and the limits set at run time, when the
        last read is stale (``advertised.py``, ``limits/live.py``; never raises). Every create does it first;
        then the checks below use it."""
        await self.advertised.refresh(self.pg)
        await live.refresh(self.limits, self.pg)

    def _handler(self, name: str) -> tuple[Handler | None, Advertisement | None]:
        """This process's own handler of ``name`` (a fallback is none), else what a live instance advertises."""
        if self.registry is not None and name in self.registry:
            return self.registry.get(name), None
        return None, self.advertised.get(name)

    def check_payload(self, spec: TaskSpec, field_prefix: str = "") -> None:
        """Refuse ``spec`` when its payload does not fit its handler's declared type.

        By this process's own handler of the name; else by the payload schema a live instance
        advertises for it (``payload_schema.py``: it never refuses what the handler would take);
        a name no live instance advertises is stored unchecked and logged
        (``task_name_unadvertised``). Fields are named under ``field_prefix``
        (``tasks[3].payload.customer_id``).

        :raises InvalidTaskError: it does not fit.
        """
        own, advertised = self._handler(spec.name)
        try:
            if own is not None:
                assert self.registry is not None
                self.registry.check_payload(spec.name, spec.payload)
            elif advertised is not None:
                if advertised.payload is not None:
                    advertised.payload.check(spec.payload)
            else:
                self.advertised.note_unknown(spec.name)
        except InvalidTaskError as exc:
            raise exc.under(field_prefix) from None

    def limit_keys(self, spec: TaskSpec, queue: str, field: str) -> list[str] | None:
        """The limit keys ``spec`` holds in ``queue`` (:meth:`LimitBook.keys_for`); ``None``: none.

        :raises InvalidTaskError: its ``concurrency_key`` names no limit in force (on ``field``).
        """
        if not self.limits and spec.concurrency_key is None:
            return None
        return self.limits.keys_for(
            queue=queue,
            name=spec.name,
            tenant_id=spec.tenant_id,
            payload=spec.payload,
            concurrency_key=spec.concurrency_key,
            field=field,
        )

    def queue_for(self, name: str, queue: str | None = None) -> str:
        """The queue a task named ``name`` goes to: ``queue`` when given, else its handler's (this
        process's own, else as a live instance advertises it), else ``default``."""
        if queue is not None:
            return queue
        own, advertised = self._handler(name)
        found = own.queue if own is not None else advertised.queue if advertised is not None else None
        return found or DEFAULT_QUEUE

    def resolve_defaults(self, spec: TaskSpec) -> tuple[str, int, str]:
        """A spec's defaults resolved: ``(queue, max_retries, type)``.

        The queue and max_retries are the request's, else its handler's (this process's own, else
        as advertised), else the defaults; the type is ``delayed`` when it has a delay or a
        ``run_at``, else ``immediate``.
        """
        own, advertised = self._handler(spec.name)
        max_retries = spec.max_retries
        if max_retries is None:
            max_retries = own.max_retries if own is not None else advertised.max_retries if advertised else None
        if max_retries is None:
            max_retries = self.default_max_retries
        queue = self.queue_for(spec.name, spec.queue_name if "queue_name" in spec.model_fields_set else None)
        delayed = spec.run_at is not None or bool(spec.delay_seconds)
        return queue, max_retries, TaskType.DELAYED if delayed else TaskType.IMMEDIATE

    async def advertised_handler(self, name: str) -> Advertisement | None:
        """The handler of ``name`` a live instance advertises (read again when stale), for a fallback
        handler that must leave such a name alone (``services/executor.py``)."""
        await self.learn()
        return self.advertised.get(name)

    async def insert_many(
        self,
        pg: PgStore,
        specs: Sequence[TaskSpec],
        *,
        field_prefix: str = "tasks[{i}].",
        task_type: str | None = None,
        copy: bool = True,
        quota: bool = False,
        positions: Sequence[int] | None = None,
    ) -> tuple[list[Enqueued], Collection[PushTarget]]:
        """The PostgreSQL half of :meth:`enqueue_many`, on ``pg`` (a transaction's store, or the pool's).

        The caller pushes the returned targets with :meth:`push` once the
        transaction committed (docs/internals/design.md principle 1: PostgreSQL first).
        :data:`COPY_MIN_TASKS` or more immediate tasks without a dedup key are copied
        (:func:`~taskmesh.tasks.copy_enqueue.copy_many`) unless ``copy`` is false; others go in one ``task_insert_many``
        statement.

        The caller reads the advertised handlers first (:meth:`learn`), before it opens the
        transaction: a read in here, on ``pg``'s pool, would hold a second connection of it
        while the transaction holds one (the checks use the last read, at most a few seconds old).

        :param quota: hold the tenants' ``max_queued`` quotas (:meth:`enforce_queued`); ``pg`` must then be
            a transaction (a schedule's fires do not: the operator's config made them).
        :param positions: each spec's place in the caller's list, for naming a refused one (a part of a batch).

        A throttled spec takes its window's dedup key; debounced ones are created or replaced by
        ``tasks/debounce.py`` (in the same statement group on ``pg``).
        :raises QuotaExceededError: with ``quota``, a tenant would hold more than its ``max_queued``.
        """
        if not specs:
            return [], []
        if any(s.throttle is not None for s in specs):
            now_ms = self.redis.now_ms()
            specs = [debounce.throttled(s, now_ms) for s in specs]
        if positions is None and any(s.debounce is not None for s in specs):
            return await self._insert_debounced(pg, specs, field_prefix, task_type, quota)
        # With limits in force each task's keys are planned (the COPY streams rows without them).
        copying = copy and positions is None and len(specs) >= COPY_MIN_TASKS and not self.limits
        if copying and all(copyable(s) for s in specs):
            copied, pushes, tenants = await copy_many(
                self, pg, len(specs), lambda a, b: specs[a:b], field_prefix, task_type, quota=quota
            )
            _note_created(copied, tenants)
            return copied, pushes
        planned = enqueue_plan.plan(self, specs, field_prefix=field_prefix, task_type=task_type, positions=positions)
        ids = planned.ids
        rows = await pg.tasks.insert_many(planned.columns())
        created = {r["id"]: r for r in rows}
        existing: dict[tuple[str, str], tuple[uuid.UUID, str, str | None]] = {}
        missing_keys = [
            (s.dedup_key, s.tenant_id or "")
            for s, i in zip(specs, ids, strict=True)
            if i not in created and s.dedup_key
        ]
        if missing_keys:
            for r in await pg.tasks.find_by_idempotency_keys(missing_keys):
                existing[r["idempotency_key"], r["tenant"]] = (r["id"], r["status"], r["trace_id"])
        out: list[Enqueued] = []
        targets: list[PushTarget] = []
        for spec, task_id, trace, queue, keys in zip(
            specs, ids, planned.traces, planned.queues, planned.limit_keys, strict=True
        ):
            row = created.get(task_id)
            if row is not None:
                out.append(Enqueued(task_id, TaskStatus.QUEUED, created=True, trace_id=trace, queue=queue))
                due = row["run_at"] if row["delayed"] else None
                targets.append(PushTarget(task_id, queue, spec.priority, due, keys.split("\n") if keys else None))
                if self.metrics:
                    self.metrics.task_created(queue)
            else:
                # Only a key conflict inserts nothing (keys are unique per tenant).
                found = existing.get((spec.dedup_key or "", spec.tenant_id or ""))
                if found is None:  # deleted between the two statements: vanishingly rare, say so
                    raise TaskNotFoundError("", f"the task of dedup_key {spec.dedup_key!r} was deleted meanwhile")
                found_id, status, found_trace = found
                out.append(Enqueued(found_id, status, created=False, trace_id=found_trace))
                if self.metrics:
                    self.metrics.task_deduplicated(queue)
        if quota:
            made = created_by_tenant(s.tenant_id for s, o in zip(specs, out, strict=True) if o.created)
            await self.enforce_queued(pg, made)
        _note_created(out, {s.tenant_id for s in specs if s.tenant_id is not None})
        return out, targets

    async def _insert_debounced(
        self, pg: PgStore, specs: Sequence[TaskSpec], field_prefix: str, task_type: str | None, quota: bool
    ) -> tuple[list[Enqueued], list[PushTarget]]:
        """:meth:`insert_many` of a batch holding debounced specs: those through ``tasks/debounce.py``, the others
        as usual; answers in the batch's order."""
        plain = [i for i, s in enumerate(specs) if s.debounce is None]
        out: dict[int, Enqueued] = {}
        targets: list[PushTarget] = []
        if plain:
            made, pushes = await self.insert_many(
                pg,
                [specs[i] for i in plain],
                field_prefix=field_prefix,
                task_type=task_type,
                copy=False,
                quota=quota,
                positions=plain,
            )
            out.update(zip(plain, made, strict=True))
            targets += pushes
        answers, pushes, moved = await debounce.store(
            self, pg, [(i, s) for i, s in enumerate(specs) if s.debounce is not None], field_prefix
        )
        out.update(answers)
        return [out[i] for i in range(len(specs))], [*targets, *pushes, *moved]

    async def enforce_queued(self, pg: PgStore, created: Mapping[str, int]) -> None:
        """Refuse the transaction on ``pg`` when a tenant holds more than its ``max_queued`` quota
        (:meth:`~taskmesh.tasks.queued_quota.QueuedLimits.enforce`); nothing at all without a quota.

        :param created: the tasks the transaction created, per tenant.
        :raises QuotaExceededError: a tenant holds more; the caller rolls the transaction back.
        """
        if self.queued_limits is not None:
            await self.queued_limits.enforce(pg, created)

    async def push(self, targets: Collection[PushTarget]) -> None:
        """Push committed tasks' ids to Redis (a replaced debounced task's id taken out first: its due time
        moved); a failure is logged and left to the reconciler."""
        if not targets:
            return
        try:
            moved = [(t.queue, str(t.task_id)) for t in targets if isinstance(t, PushTarget) and t.moved]
            if moved:
                await self.redis.forget_many(moved)
            if isinstance(targets, ReadyTargets):
                await self.redis.push_ready(targets.by_queue)
            else:
                await self.redis.push(targets)
        except StoreError as exc:
            if self.metrics:
                self.metrics.redis_push_failures.inc()
            log.warning("redis_push_failed", tasks=len(targets), error=str(exc))

    # -- read ------------------------------------------------------------------

    async def get(self, task_id: uuid.UUID) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The task and its latest run, read in one statement; the task says why it is not running yet
        (``blocked_by``: ``limits/waiting.py``).

        :raises TaskNotFoundError: no task has this id.
        """
        row = await self.pg.tasks.get_with_latest_run(task_id)
        if row is None:
            raise TaskNotFoundError(str(task_id))
        task, run = task_and_latest_run(row)
        task["blocked_by"] = await waiting.blocked_by(self.redis, self.limits, row)
        return task, run

    async def runs(self, task_id: uuid.UUID) -> list[dict[str, Any]]:
        """Every run of a task, by attempt, with its error and traceback.

        :raises TaskNotFoundError: no task has this id.
        """
        rows = await self.pg.tasks.runs(task_id)
        if not rows and not await self.pg.tasks.exists(task_id):
            raise TaskNotFoundError(str(task_id))
        return [_run_to_dict(r) for r in rows]

    async def dead_letters(self, queue: str, count: int, tenant_id: str | None = None) -> list[dict[str, Any]]:
        """Up to ``count`` dead-lettered tasks of ``queue`` (of ``tenant_id`` when given), oldest first, read in
        one statement.

        :returns: each task in the API's shape without ``payload`` (:meth:`get` has it), with
            ``latest_run``: ``{"attempt", "status", "error", "finished_at"}`` saying why it failed.
        """
        rows = await self.pg.tasks.list_failed_with_latest_run(queue, count, tenant_id)
        return [task_summary_to_dict(r) for r in rows]

    # -- claim and finish ----------------------------------------------------------

    async def claim(
        self,
        queue: str,
        ids: Sequence[str],
        worker_id: str,
        lease_seconds: float,
        slots: Mapping[str, Sequence[str]] | None = None,
    ) -> list[ClaimedTask]:
        """Claim popped ids in one conditional UPDATE (docs/internals/design.md principle 3).

        ``slots`` are the limit keys whose slots the admission gave each id (``{task id: keys}``):
        an id not claimed gives them back before anything is pushed again.

        Ids that are no longer queued (claimed elsewhere, duplicates) are dropped
        quietly; ids not due yet go back to the delayed set, and those of a paused
        queue (none is claimed there) back to the ready set. A claimed row this
        version cannot read (a payload that is not JSON) is still returned, with
        ``defect`` saying why, so that its run is failed, not lost. A task of a workflow comes with
        its deps' results and its workflow (``workflows/inputs.py``).
        """
        uuids = [uuid.UUID(raw) for raw in ids]  # RedisStore returns canonical task ids only
        if not uuids:
            return []
        rows = await self.pg.tasks.claim_many(uuids, queue, worker_id, lease_seconds)
        if len(rows) < len(uuids):
            claimed_ids = {str(r["id"]) for r in rows}
            refused = [Release(i, keys) for i, keys in (slots or {}).items() if keys and i not in claimed_ids]
            await self._give_back(queue, refused)
            await self._return_unclaimed(uuids, {r["id"] for r in rows})
        claimed = [_claimed(r) for r in rows]
        if any(t.workflow_id is not None for t in claimed):
            claimed = await inputs.attach(self.pg, claimed, self.workflow_parents_max_bytes)
        return claimed

    async def _return_unclaimed(self, popped: Sequence[uuid.UUID], claimed: set[uuid.UUID]) -> None:
        """Push popped ids that are still queued back, so that they run when they can.

        A queued task the claim refused is either not due yet (an id pushed early by a
        race: back to the delayed set, by PostgreSQL's clock) or in a paused queue (back
        to the ready set, for when the queue resumes). Everything else that was not
        claimed (claimed elsewhere, cancelled, finished) is dropped quietly.
        """
        unclaimed = [i for i in popped if i not in claimed]
        rows = await self.pg.tasks.list_unclaimed_queued(unclaimed)
        if rows:
            await self.push(
                [
                    PushTarget(
                        r["id"], r["queue"], r["priority"], r["run_at"] if r["delayed"] else None, r["limit_keys"]
                    )
                    for r in rows
                ]
            )

    async def finish(self, results: Sequence[RunResult], worker_id: str) -> int:
        """Write a batch of run results in one statement, then update Redis.

        Retried tasks go to their queue's delayed set, dead-lettered ones to its
        DLQ mirror, interrupted ones back to ready.

        :returns: results written (a fenced-out late result is not).
        :raises StoreError: PostgreSQL failed; nothing was written.
        """
        if not results:
            return 0
        rows = await self.pg.tasks.finish_many(
            [r.task.run_id for r in results],
            [r.task.task_id for r in results],
            [r.outcome.value for r in results],
            [r.error for r in results],
            [r.result for r in results],
            [float(r.delay_seconds) for r in results],
            [r.traceback for r in results],
            worker_id,
        )
        await self.mirror(rows, {r.task.task_id: r.back_off_seconds for r in results if r.back_off_seconds})
        if len(rows) < len(results):
            self._late(results, {row["id"] for row in rows}, worker_id)
        return len(rows)

    def _late(self, results: Sequence[RunResult], written: set[uuid.UUID], worker_id: str) -> None:
        if self.metrics:
            self.metrics.late_results.inc(len(results) - len(written))
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

    async def _give_back(self, queue: str, releases: Sequence[Release]) -> None:
        """Give limit slots back (``RedisLimits.release``); a failure is logged: the slots lapse with their leases."""
        if not releases:
            return
        try:
            await self.redis.limits.release(
                queue,
                releases,
                self.limits.script_args(),
                fair=self.limits.fair_args(queue),
            )
        except StoreError as exc:
            log.warning("limit_release_failed", queue=queue, runs=len(releases), error=str(exc))

    async def mirror(self, rows: Sequence[Any], back_off: Mapping[uuid.UUID, float] | None = None) -> None:
        """The Redis follow-up of status changes, one path for every statement that makes them (a result, a
        reclaim, a cancel of one task or of many, a workflow's cancel): a task that held limit slots gives them
        back first (its limit keys forgotten when it is over), then queued tasks go to ready or delayed,
        failed ones to the DLQ mirror, cancelled ones out of ready and delayed, and every end is announced to
        requests waiting for it (``store/finished.py``). A running task (a cancel requested) and a blocked
        one are not in Redis: nothing. A failure is logged and left to the reconciler.

        :param rows: transition rows: ``id, queue, priority, status, run_at, limit_keys`` of each changed task.
        :param back_off: seconds each task's limit keys wait (a handler's ``RateLimited``), by task id.
        """
        pushes: list[PushTarget] = []
        dead: dict[str, list[str]] = defaultdict(list)
        forget: list[tuple[str, str]] = []
        finished: list[uuid.UUID] = []
        releases: dict[str, list[Release]] = defaultdict(list)
        for row in rows:
            status = row["status"]
            keys = row["limit_keys"]
            if keys and status not in (TaskStatus.RUNNING, TaskStatus.BLOCKED):
                given = self._release_of(row["id"], keys, status, back_off)
                if given.limit_keys or given.ended:
                    releases[row["queue"]].append(given)
            if status == TaskStatus.QUEUED:
                pushes.append(PushTarget(row["id"], row["queue"], row["priority"], row["run_at"], keys))
            elif status in FINISHED_TASK_STATUSES:
                finished.append(row["id"])
                if status == TaskStatus.FAILED:
                    dead[row["queue"]].append(str(row["id"]))
                elif status == TaskStatus.CANCELLED:
                    forget.append((row["queue"], str(row["id"])))
        for queue, runs in releases.items():  # before the pushes: a pushed id must not meet its own slot
            await self._give_back(queue, runs)
        try:
            if pushes:
                await self.redis.push_ready_or_delayed(pushes)
            for queue, ids in dead.items():
                await self.redis.dead_letter(queue, ids)
            if forget:
                await self.redis.forget_many(forget)
            await self.redis.finished.announce(finished)
        except StoreError as exc:  # Postgres has it; the reconciler repairs Redis
            log.warning("redis_push_failed", tasks=len(pushes), error=str(exc))

    def _release_of(
        self, task_id: uuid.UUID, keys: Sequence[str], status: str, back_off: Mapping[uuid.UUID, float] | None
    ) -> Release:
        """What a task that left ``running`` (or a queued one cancelled) gives back; a ``RateLimited`` run's
        keys with a rate (else all its keys) wait ``back_off`` seconds."""
        seconds = (back_off or {}).get(task_id)
        limited = [k for k in keys if not k.startswith(FAIR_MARK)]  # a fairness key never backs off
        slow: list[str] = []
        if seconds:
            rated = {n for n, s in self.limits.limits.items() if s.rate is not None}
            slow = [k for k in limited if limit_name(k) in rated]
        return Release(
            str(task_id),
            list(keys),
            back_off=slow or (limited if seconds else []),
            until_ms=self.redis.now_ms() + round(seconds * 1000) if seconds else 0,
            ended=status in FINISHED_TASK_STATUSES,
        )


def _due(row: Any) -> datetime | None:
    """A listed queued task's due time when PostgreSQL says it is not due yet, else ``None`` (ready)."""
    return row["run_at"] if row["delayed"] else None


def _note_created(out: Sequence[Enqueued], tenants: Collection[str]) -> None:
    """What a create tells the audit log (before its transaction commits; nothing outside a request).

    :param tenants: the tenants the created tasks belong to.

    The task is the event's resource, unless the event already has one (a schedule's trigger):
    then its id goes into the details.
    """
    event = audit.CURRENT.get()
    if event is None:
        return
    event.tenant_id = event.tenant_id or (next(iter(tenants)) if len(tenants) == 1 else None)
    if len(out) == 1:
        event.trace_id = out[0].trace_id or event.trace_id  # the task's own, which its log lines carry
    if len(out) == 1 and event.resource_type is None:
        event.resource_type, event.resource_id = "task", str(out[0].task_id)
    elif len(out) == 1:
        event.details["task_id"] = str(out[0].task_id)
    else:
        created = [str(o.task_id) for o in out if o.created]
        event.resource_type = event.resource_type or "task"
        event.details.update({"created": len(created), "sample": created[:10]})


def _claimed(r: Any) -> ClaimedTask:
    """A claimed row as a :class:`ClaimedTask`; an unreadable payload becomes a ``defect``."""
    defect: str | None = None
    try:
        payload = orjson.loads(r["payload"])
    except orjson.JSONDecodeError as exc:
        payload, defect = None, f"the task's payload cannot be read: {exc}"
    return ClaimedTask(
        task_id=r["id"],
        run_id=r["run_id"],
        name=r["name"],
        queue=r["queue"],
        priority=r["priority"],
        payload=payload,
        attempt=r["attempts"],
        retries=r["retries"],
        max_retries=r["max_retries"],
        idempotency_key=r["idempotency_key"],
        trace_id=r["trace_id"],
        tenant_id=r["tenant_id"],
        ready_at=_epoch(r["run_at"]),
        defect=defect,
        timeout=r["timeout_s"],
        workflow_id=r["workflow_id"],
        workflow_node=r["workflow_node"],
        map_index=r["map_index"],
        limit_keys=r["limit_keys"],
    )
