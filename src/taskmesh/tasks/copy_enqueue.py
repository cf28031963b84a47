"""A bulk enqueue by ``COPY``: Python validates and writes the next rows while PostgreSQL stores the ones before.

A bulk of immediate tasks without a dedup key cannot conflict with anything, so it is copied
(``COPY``), which PostgreSQL writes for about a quarter less per row than an ``INSERT``. The
batch is one transaction of ``COPY`` statements (:data:`COPY_STATEMENT_TASKS` rows each) whose
rows are streamed a slice at a time as they are prepared: a task found invalid in a later
slice ends the stream and rolls the transaction back, so nothing is written. The client
validates here too (:func:`copyable_mapping` says which raw batches may), so pydantic's time
per task runs beside PostgreSQL's rather than before it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

import anyio
import orjson

from taskmesh.errors import InvalidTaskError
from taskmesh.ids import uuid7_text
from taskmesh.observability.tracing import new_trace_ids
from taskmesh.store import PgStore
from taskmesh.tasks.models import Enqueued, PushTarget
from taskmesh.tasks.states import TaskStatus
from taskmesh.tasks.validation import TaskSpec, dump_json

if TYPE_CHECKING:
    from taskmesh.observability.metrics import Metrics


class EnqueueRules(Protocol):
    """What a copy needs of the task facade (:class:`~taskmesh.tasks.tasks.Tasks` is one).

    A protocol, so that this module stays below the facade that uses it.
    """

    @property
    def metrics(self) -> Metrics | None:
        """The instance's metrics, which count the creates (``None`` in the client and the CLI)."""

    def check_payload(self, spec: TaskSpec, field_prefix: str = "") -> None:
        """Refuse ``spec`` when its payload does not fit its handler's declared type.

        :raises InvalidTaskError: it does not fit.
        """

    def resolve_defaults(self, spec: TaskSpec) -> tuple[str, int, str]:
        """A spec's defaults resolved: ``(queue, max_retries, type)``."""

    async def enforce_queued(self, pg: PgStore, created: Mapping[str, int]) -> None:
        """Refuse the transaction on ``pg`` when a tenant holds more than its ``max_queued`` quota.

        :raises QuotaExceededError: a tenant is past its quota.
        """


COPY_MIN_TASKS = 64
"""A bulk enqueue of at least this many immediate tasks without a dedup key is copied (``COPY``):
PostgreSQL writes a copied row for about a quarter less than an inserted one. Fewer go in one
INSERT, one round trip."""
PREPARE_SLICE_TASKS = 25
"""Tasks validated, written as ``COPY`` text and sent at once (one ``CopyData`` message): small
enough that PostgreSQL starts on the first rows a fraction of a millisecond after the call."""
COPY_STATEMENT_TASKS = 250
"""Rows per ``COPY`` statement of a bulk enqueue. PostgreSQL writes a statement's search rows
when it ends (migration 0020's trigger), while the client prepares the next statement's rows:
with one statement for a whole bulk the client waited for all of them at the end."""
BACKSLASH = "\\"
TWO_BACKSLASHES = "\\\\"

SpecSlice = Callable[[int, int], Sequence[TaskSpec]]
"""``(start, stop) -> specs[start:stop]``: the validated tasks of one slice of the batch.

It raises :class:`~taskmesh.errors.InvalidTaskError` for a slice holding an invalid task,
naming it by its index in the whole batch (``tasks[612].priority``)."""


class ReadyTargets(Collection[PushTarget]):
    """Copied tasks' push targets (all ready now), held as ``{queue: {task id: priority}}`` until the push.

    Not a :class:`~taskmesh.tasks.models.PushTarget` per task: a thousand objects that live until the
    push are what makes the garbage collector run, and each of its runs walks them and,
    every few batches, the whole heap. The ids are held as the text the rows were written
    with, so the push after the commit (:meth:`~taskmesh.store.redis.RedisStore.push_ready`)
    only scores and sends. Iterating yields the targets one at a time.
    """

    __slots__ = ("by_queue",)

    def __init__(self) -> None:
        self.by_queue: dict[str, dict[str, int]] = {}

    def add(self, queue: str, task_id: str, priority: int) -> None:
        """Note task ``task_id`` (its text) of ``queue`` at ``priority``, ready now."""
        members = self.by_queue.get(queue)
        if members is None:
            members = self.by_queue[queue] = {}
        members[task_id] = priority

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
""":meth:`~taskmesh.tasks.tasks.Tasks.resolve_defaults`'s answers by (name, queue given, max_retries)."""


def copyable(spec: TaskSpec) -> bool:
    """Whether a task can be copied (``COPY``): immediate, without a dedup key (nothing can conflict)."""
    return (
        spec.dedup_key is None
        and spec.run_at is None
        and not spec.delay_seconds
        and spec.concurrency_key is None
        and spec.debounce is None
        and spec.throttle is None
    )


def copyable_mapping(item: Mapping[str, Any]) -> bool:
    """Whether a task not validated yet would be :func:`copyable` once it is (it may still be invalid)."""
    return (
        item.get("dedup_key") is None
        and item.get("run_at") is None
        and item.get("delay_seconds") in (None, 0)
        and item.get("type", "immediate") == "immediate"
        and item.get("concurrency_key") is None
        and item.get("debounce") is None
        and item.get("throttle") is None
    )


async def copy_many(
    tasks: EnqueueRules,
    pg: PgStore,
    count: int,
    specs: SpecSlice,
    field_prefix: str,
    task_type: str | None,
    *,
    quota: bool = False,
) -> tuple[list[Enqueued], ReadyTargets, Counter[str]]:
    """Copy ``count`` copyable tasks into ``tasks`` (``COPY``), in one transaction on ``pg``.

    This coroutine validates the tasks a slice of :data:`PREPARE_SLICE_TASKS` at a time and
    writes each slice as ``COPY`` text; a second one (:func:`_copy_statements`) streams the
    slices to PostgreSQL as they come, :data:`COPY_STATEMENT_TASKS` to a statement. So the
    client's time per task and PostgreSQL's overlap, and the search rows that PostgreSQL
    writes at the end of each statement (migration 0020's trigger) are written while the
    client prepares the next statement's rows.

    :param tasks: the facade whose registry and defaults apply (:meth:`~taskmesh.tasks.tasks.Tasks.check_payload`,
        :meth:`~taskmesh.tasks.tasks.Tasks.resolve_defaults`) and whose metrics count the creates.
    :param specs: the batch's validated tasks, a slice at a time (:data:`SpecSlice`); every one
        :func:`copyable`.
    :param field_prefix: how an error names task ``i`` (``tasks[{i}].``).
    :param task_type: overrides the ``type`` column.
    :param quota: hold the tenants' ``max_queued`` quotas (:meth:`~taskmesh.tasks.tasks.Tasks.enforce_queued`)
        once the rows are copied, in the same transaction.
    :returns: one :class:`Enqueued` per task, in order; the push targets for after the commit;
        the tasks per tenant (each slice's specs are let go once prepared).
    :raises InvalidTaskError: a task is invalid, its payload does not fit its handler or is not
        JSON-serialisable; the transaction is rolled back.
    :raises QuotaExceededError: a tenant would hold more than its ``max_queued``; rolled back.
    :raises StoreError: PostgreSQL failed; nothing was written.
    """
    out: list[Enqueued] = []
    targets = ReadyTargets()
    tenants: Counter[str] = Counter()
    traces = new_trace_ids(count)
    defaults: Defaults = {}  # by handler, not by task
    queued = TaskStatus.QUEUED
    slices: asyncio.Queue[bytes | None] = asyncio.Queue()
    async with pg.atomic() as tx:
        # asyncpg runs on asyncio only: its COPY goes on while this coroutine prepares
        copying = asyncio.ensure_future(_copy_statements(tx, slices, count))
        try:
            for first in range(0, count, PREPARE_SLICE_TASKS):
                lines = []
                for i, spec in enumerate(specs(first, min(first + PREPARE_SLICE_TASKS, count)), first):
                    trace = spec.trace_id or traces[i]
                    task_id, text_id, queue, line = _line(tasks, spec, field_prefix, i, trace, task_type, defaults)
                    lines.append(line)
                    targets.add(queue, text_id, spec.priority)
                    out.append(Enqueued(task_id, queued, True, trace, queue))
                    if spec.tenant_id is not None:
                        tenants[spec.tenant_id] += 1
                slices.put_nowait("".join(lines).encode())
                await asyncio.sleep(0)  # the COPY sends this slice; other requests go on meanwhile
                if copying.done():  # PostgreSQL failed: stop preparing, raise its error below
                    break
            slices.put_nowait(None)
            await copying
        except InvalidTaskError:
            # The statement in flight ends with the rows it was sent (rolled back below with the
            # rest): cancelling it would abort the COPY through a second connection.
            slices.put_nowait(None)
            await _settle(copying, cancel=False)
            raise
        except BaseException:
            await _settle(copying)  # the rollback needs the connection free
            raise
        if quota:
            await tasks.enforce_queued(tx, tenants)
    if tasks.metrics:
        for queue, n in targets.counts().items():
            tasks.metrics.task_created(queue, n)
    return out, targets, tenants


async def _copy_statements(tx: PgStore, slices: asyncio.Queue[bytes | None], count: int) -> None:
    """Copy the slices put on ``slices`` (``None`` ends them), :data:`COPY_STATEMENT_TASKS` rows a statement.

    :param count: rows the batch holds (the last statement ends at the last slice, not at ``None``).
    :raises StoreError: PostgreSQL failed.
    """
    per_statement = max(1, COPY_STATEMENT_TASKS // PREPARE_SLICE_TASKS)
    left = -(-count // PREPARE_SLICE_TASKS)  # slices to come
    ended = False

    async def statement_rows() -> AsyncIterator[bytes]:
        nonlocal left, ended
        for _ in range(min(per_statement, left)):
            chunk = await slices.get()
            if chunk is None:
                ended = True
                return
            left -= 1
            yield chunk

    while left and not ended:
        await tx.tasks.copy_in(statement_rows())


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
"""``COPY``'s text format: these four characters are written escaped."""


def copy_text(value: str | None) -> str:
    """``value`` as one field of a ``COPY`` text row: ``\\N`` for None, backslash, tab and line breaks escaped."""
    if value is None:
        return "\\N"
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_ESCAPES)
    return value


def _line(
    tasks: EnqueueRules,
    spec: TaskSpec,
    field_prefix: str,
    i: int,
    trace_id: str,
    task_type: str | None,
    defaults: Defaults,
) -> tuple[UUID, str, str, str]:
    """Task ``i``'s new id (and as text), its queue, and its row in ``COPY`` text (:data:`COPY_COLUMNS`).

    Name and queue need no escaping (``NAME_REGEX``); a payload is JSON, in which orjson
    escapes every control character, so only its backslashes are doubled.

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
    task_id, text_id = uuid7_text()
    payload = payload.replace(BACKSLASH, TWO_BACKSLASHES)
    line = (
        f"{text_id}\t{spec.name}\t{task_type or kind}\t{queue}\t{spec.priority}\t{payload}"
        f"\t{max_retries}\t{copy_text(spec.tenant_id)}\t{copy_text(trace_id)}\tqueued\n"
    )
    return task_id, text_id, queue, line


async def _settle(future: asyncio.Future[None], *, cancel: bool = True) -> None:
    """Wait for ``future``, shielded, cancelling it first if ``cancel``.

    Its own error is dropped: the caller's wins.
    """
    if cancel and not future.done():
        future.cancel()
    with anyio.CancelScope(shield=True):
        await asyncio.wait([future])
    if not future.cancelled():
        future.exception()  # retrieved: asyncio would log it as never retrieved
