"""The one enqueue plan: what becomes of validated tasks, as the columns of ``task_insert_many`` (pure).

Every writer of tasks but the bulk ``COPY`` goes through it: an enqueue of one or many, a
transactional enqueue, a schedule's fires (all through ``Tasks.insert_many``) and a workflow's
nodes (``workflows/plan.py``), so that what a task row holds is decided in one place. The
``COPY`` of a plain bulk (``copy_enqueue.py``) streams text rows of immediate tasks without a
dedup key and takes only what :func:`~taskmesh.tasks.copy_enqueue.copyable` lets through; a task
with anything more (a workflow, a delay, a key) is planned here.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from taskmesh.ids import uuid7
from taskmesh.observability.tracing import new_trace_ids
from taskmesh.tasks.states import TaskStatus, TaskType
from taskmesh.tasks.validation import TaskSpec, dump_json


class PlanRules(Protocol):
    """What a plan needs of the task facade (:class:`~taskmesh.tasks.tasks.Tasks` is one)."""

    def check_payload(self, spec: TaskSpec, field_prefix: str = "") -> None:
        """Refuse ``spec`` when its payload does not fit its handler's declared type.

        :raises InvalidTaskError: it does not fit.
        """

    def resolve_defaults(self, spec: TaskSpec) -> tuple[str, int, str]:
        """A spec's defaults resolved: ``(queue, max_retries, type)``."""

    def limit_keys(self, spec: TaskSpec, queue: str, field: str) -> list[str] | None:
        """The limit keys ``spec`` holds in ``queue`` (``LimitBook.keys_for``); ``None``: none.

        :raises InvalidTaskError: its ``concurrency_key`` names no limit in force (on ``field``).
        """


@dataclass(slots=True)
class TaskRows:
    """Tasks as the columns of ``task_insert_many``, one item per task."""

    ids: list[uuid.UUID] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    payloads: list[str] = field(default_factory=list)
    dedup_keys: list[str | None] = field(default_factory=list)
    max_retries: list[int] = field(default_factory=list)
    run_ats: list[datetime | None] = field(default_factory=list)
    delays: list[float | None] = field(default_factory=list)
    tenants: list[str | None] = field(default_factory=list)
    traces: list[str | None] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    workflow_ids: list[uuid.UUID | None] = field(default_factory=list)
    workflow_nodes: list[str | None] = field(default_factory=list)
    map_indexes: list[int | None] = field(default_factory=list)
    timeouts: list[float | None] = field(default_factory=list)
    limit_keys: list[str | None] = field(default_factory=list)
    """Each task's limit keys, one per line (``None``: none): one text per task, as ``unnest`` takes them."""

    def add(
        self,
        *,
        name: str,
        queue: str,
        priority: int,
        payload: str,
        max_retries: int,
        task_type: str = TaskType.IMMEDIATE,
        dedup_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | None = None,
        tenant_id: str | None = None,
        trace_id: str | None = None,
        status: str = TaskStatus.QUEUED,
        workflow_id: uuid.UUID | None = None,
        workflow_node: str | None = None,
        map_index: int | None = None,
        timeout: float | None = None,
        task_id: uuid.UUID | None = None,
        limit_keys: Sequence[str] | None = None,
    ) -> uuid.UUID:
        """Add one task; returns its id (a new time-ordered one unless given).

        :param payload: its payload as JSON text.
        :param status: ``queued``, or ``blocked`` for a workflow's task waiting for its deps.
        """
        task_id = task_id or uuid7()  # time-ordered: each insert lands at the primary key's right edge
        self.ids.append(task_id)
        self.names.append(name)
        self.types.append(task_type)
        self.queues.append(queue)
        self.priorities.append(priority)
        self.payloads.append(payload)
        self.dedup_keys.append(dedup_key)
        self.max_retries.append(max_retries)
        self.run_ats.append(run_at)
        self.delays.append(delay)
        self.tenants.append(tenant_id)
        self.traces.append(trace_id)
        self.statuses.append(status)
        self.workflow_ids.append(workflow_id)
        self.workflow_nodes.append(workflow_node)
        self.map_indexes.append(map_index)
        self.timeouts.append(timeout)
        self.limit_keys.append("\n".join(limit_keys) if limit_keys else None)
        return task_id

    @classmethod
    def joined(cls, parts: Sequence[TaskRows]) -> TaskRows:
        """The rows of ``parts`` one after the other, as one plan (one ``task_insert_many`` stores them all)."""
        if len(parts) == 1:
            return parts[0]
        out = cls()
        columns = out.columns()
        for part in parts:
            for column, values in zip(columns, part.columns(), strict=True):
                column.extend(values)
        return out

    def columns(self) -> list[list[Any]]:
        """The eighteen arrays in ``task_insert_many``'s order."""
        return [
            self.ids,
            self.names,
            self.types,
            self.queues,
            self.priorities,
            self.payloads,
            self.dedup_keys,
            self.max_retries,
            self.run_ats,
            self.delays,
            self.tenants,
            self.traces,
            self.statuses,
            self.workflow_ids,
            self.workflow_nodes,
            self.map_indexes,
            self.timeouts,
            self.limit_keys,
        ]

    def __len__(self) -> int:
        return len(self.ids)


def plan(
    rules: PlanRules,
    specs: Sequence[TaskSpec],
    *,
    field_prefix: str = "tasks[{i}].",
    task_type: str | None = None,
    positions: Sequence[int] | None = None,
) -> TaskRows:
    """The rows of validated tasks: their payloads checked against their handlers, their defaults
    resolved (queue, max_retries, type), ids and trace ids made.

    :param field_prefix: how a refused task is named (``tasks[{i}].``: ``tasks[3].payload.id``).
    :param positions: each spec's place in the caller's list, for those names (default: its place in ``specs``).
    :param task_type: overrides the ``type`` column (``cron`` for a schedule's fires).
    :raises InvalidTaskError: a payload does not fit its handler, or is not storable JSON, or a
        ``concurrency_key`` names no limit; nothing is planned.
    """
    places = list(positions) if positions is not None else list(range(len(specs)))
    for i, spec in zip(places, specs, strict=True):
        rules.check_payload(spec, field_prefix.format(i=i))
    fresh = new_trace_ids(len(specs))
    rows = TaskRows()
    for n, (i, spec) in enumerate(zip(places, specs, strict=True)):
        queue, max_retries, resolved_type = rules.resolve_defaults(spec)
        keys = rules.limit_keys(spec, queue, field_prefix.format(i=i) + "concurrency_key")
        rows.add(
            name=spec.name,
            queue=queue,
            priority=spec.priority,
            payload=dump_json(spec.payload, field_prefix.format(i=i) + "payload"),
            max_retries=max_retries,
            task_type=task_type or resolved_type,
            dedup_key=spec.dedup_key,
            run_at=spec.run_at,
            delay=spec.delay_seconds,
            tenant_id=spec.tenant_id,
            trace_id=spec.trace_id or fresh[n],  # every task can be followed in the logs
            limit_keys=keys,
        )
    return rows
