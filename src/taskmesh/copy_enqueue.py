"""A bulk enqueue by ``COPY``: Python validates and prepares the next chunk while PostgreSQL copies the one before.

A bulk of immediate tasks without a dedup key cannot conflict with anything, so it is copied
(``COPY``), which PostgreSQL writes for about a quarter less per row than an ``INSERT``. The
batch is one transaction: a task found invalid in a later chunk rolls the earlier chunks
back, so nothing is written, as with one statement. The client validates here too
(:func:`copyable_mapping` says which raw batches may), so pydantic's time per task runs beside
PostgreSQL's rather than before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import orjson

from taskmesh.errors import InvalidTaskError
from taskmesh.ids import uuid7_pair
from taskmesh.models import Enqueued, PushTarget
from taskmesh.states import TaskStatus
from taskmesh.store import PgStore
from taskmesh.tracing import new_trace_ids
from taskmesh.validation import TaskSpec, dump_json

if TYPE_CHECKING:
    from taskmesh.tasks import Tasks

COPY_MIN_TASKS = 64
"""A bulk enqueue of at least this many immediate tasks without a dedup key is copied (``COPY``):
PostgreSQL writes a copied row for about a quarter less than an inserted one. Fewer go in one
INSERT, one round trip."""
COPY_CHUNK_TASKS = 250
"""Tasks per ``COPY`` statement of a bulk enqueue: Python prepares the next chunk meanwhile."""
PREPARE_SLICE_TASKS = 25
"""Tasks validated and prepared between two yields to the event loop, so the ``COPY`` in flight
makes progress."""

_QUEUED = TaskStatus.QUEUED.value  # read once: an enum member's value is a property

SpecSlice = Callable[[int, int], Sequence[TaskSpec]]
"""``(start, stop) -> specs[start:stop]``: the validated tasks of one slice of the batch.

It raises :class:`~taskmesh.errors.InvalidTaskError` for a slice holding an invalid task,
naming it by its index in the whole batch (``tasks[612].priority``)."""


class ReadyTargets(Collection[PushTarget]):
    """Copied tasks' push targets (all ready now), held as ``{queue: {task id: priority}}`` until the push.

    Not a :class:`~taskmesh.models.PushTarget` per task: a thousand objects that live until the
    push are what makes the garbage collector run, and each of its runs walks them and,
    every few batches, the whole heap. The ids' text is made here, while PostgreSQL copies
    the rows, so the push after the commit (:meth:`~taskmesh.store.redis.RedisStore.push_ready`)
    only scores and sends. Iterating yields the targets one at a time.
    """

    __slots__ = ("by_queue",)

    def __init__(self) -> None:
        self.by_queue: dict[str, dict[str, int]] = {}

    def add(self, queue: str, task_id: UUID, priority: int) -> None:
        """Note task ``task_id`` of ``queue`` at ``priority``, ready now."""
        members = self.by_queue.get(queue)
        if members is None:
            members = self.by_queue[queue] = {}
        members[str(task_id)] = priority

    def counts(self) -> dict[str, int]:
        """How many tasks each queue holds."""
        return {queue: len(members) for queue, members in self.by_queue.items()}

    def __len__(self) -> int:
        return sum(len(members) for members in self.by_queue.values())

    def __contains__(self, target: object) -> bool:
        return (
            isinstance(target, PushTarget)
            and target.due_at is None
            and self.by_queue.get(target.queue, {}).get(str(target.task_id)) == target.priority
        )

    def __iter__(self) -> Iterator[PushTarget]:
        for queue, members in self.by_queue.items():
            for task_id, priority in members.items():
                yield PushTarget(UUID(task_id), queue, priority, None)


Defaults = dict[tuple[str, str | None, int | None], tuple[str, int, str]]
""":meth:`~taskmesh.tasks.Tasks.resolve_defaults`'s answers by (name, queue given, max_retries)."""


def copyable(spec: TaskSpec) -> bool:
    """Whether a task can be copied (``COPY``): immediate, without a dedup key (nothing can conflict)."""
    return spec.dedup_key is None and spec.run_at is None and not spec.delay_seconds


def copyable_mapping(item: Mapping[str, Any]) -> bool:
    """Whether a task not validated yet would be :func:`copyable` once it is (it may still be invalid)."""
    return (
        item.get("dedup_key") is None
        and item.get("run_at") is None
        and item.get("delay_seconds") in (None, 0)
        and item.get("type", "immediate") == "immediate"
    )


async def copy_many(
    tasks: Tasks, pg: PgStore, count: int, specs: SpecSlice, field_prefix: str, task_type: str | None
) -> tuple[list[Enqueued], ReadyTargets, set[str]]:
    """Copy ``count`` copyable tasks into ``tasks`` in chunks, in one transaction on ``pg``.

    :param tasks: the facade whose registry and defaults apply (:meth:`~taskmesh.tasks.Tasks.check_payload`,
        :meth:`~taskmesh.tasks.Tasks.resolve_defaults`) and whose metrics count the creates.
    :param specs: the batch's validated tasks, a slice at a time (:data:`SpecSlice`); every one
        :func:`copyable`.
    :param field_prefix: how an error names task ``i`` (``tasks[{i}].``).
    :param task_type: overrides the ``type`` column.
    :returns: one :class:`Enqueued` per task, in order; the push targets for after the commit;
        the tenants the tasks belong to (each slice's specs are let go once prepared).
    :raises InvalidTaskError: a task is invalid, its payload does not fit its handler or is not
        JSON-serialisable; the transaction is rolled back.
    :raises StoreError: PostgreSQL failed; nothing was written.
    """
    out: list[Enqueued] = []
    targets = ReadyTargets()
    tenants: set[str] = set()
    traces = new_trace_ids(count)
    defaults: Defaults = {}  # by handler, not by task
    queued = TaskStatus.QUEUED
    async with pg.atomic() as tx:
        copying: asyncio.Future[None] | None = None
        try:
            for start in range(0, count, COPY_CHUNK_TASKS):
                stop, records = min(start + COPY_CHUNK_TASKS, count), []
                for first in range(start, stop, PREPARE_SLICE_TASKS):
                    await asyncio.sleep(0)  # the COPY in flight sends its rows or reads its answer
                    for i, spec in enumerate(specs(first, min(first + PREPARE_SLICE_TASKS, stop)), first):
                        trace = spec.trace_id or traces[i]
                        task_id, record = _record(tasks, spec, field_prefix, i, trace, task_type, defaults)
                        records.append(record)
                        queue = record[3]
                        targets.add(queue, record[0], spec.priority)
                        out.append(Enqueued(task_id, queued, True, trace, queue))
                        if spec.tenant_id is not None:
                            tenants.add(spec.tenant_id)
                if copying is not None:
                    await copying
                # asyncpg runs on asyncio only: its COPY goes on while this coroutine prepares
                copying = asyncio.ensure_future(tx.tasks.copy_in(records))
            if copying is not None:
                await copying
        except BaseException:
            await _settle(copying)  # the rollback needs the connection free
            raise
    if tasks.metrics:
        for queue, n in targets.counts().items():
            tasks.metrics.task_created(queue, n)
    return out, targets, tenants


def _record(
    tasks: Tasks, spec: TaskSpec, field_prefix: str, i: int, trace_id: str, task_type: str | None, defaults: Defaults
) -> tuple[UUID, tuple[Any, ...]]:
    """Task ``i``'s new id and its :meth:`~taskmesh.store.task_queries.TaskQueries.copy_in` record
    (whose first field is the same id as asyncpg's UUID, its fourth the queue).

    :param defaults: filled here.
    :raises InvalidTaskError: its payload does not fit its handler or is not JSON-serialisable
        (named by ``field_prefix``, formatted only then).
    """
    try:
        tasks.check_payload(spec)
        payload = orjson.dumps(spec.payload).decode()
    except (InvalidTaskError, TypeError):
        prefix = field_prefix.format(i=i)  # only now: formatting it for every task cost 0.3 µs each
        tasks.check_payload(spec, prefix)
        payload = dump_json(spec.payload, prefix + "payload")  # raises, naming the field
    key = (spec.name, spec.queue_name if "queue_name" in spec.model_fields_set else None, spec.max_retries)
    prepared = defaults.get(key)
    if prepared is None:
        prepared = defaults[key] = tasks.resolve_defaults(spec)
    queue, max_retries, kind = prepared
    task_id, stored_id = uuid7_pair()
    row = (stored_id, spec.name, task_type or kind, queue, spec.priority, payload, max_retries, spec.tenant_id)
    return task_id, (*row, trace_id, _QUEUED)


async def _settle(future: asyncio.Future[None] | None) -> None:
    """Cancel ``future`` if it still runs and wait for it, shielded; its own error is dropped (the caller's wins)."""
    if future is None:
        return
    if not future.done():
        future.cancel()
    with anyio.CancelScope(shield=True):
        await asyncio.wait([future])
    if not future.cancelled():
        future.exception()  # retrieved: asyncio would log it as never retrieved
