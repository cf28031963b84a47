"""A validated workflow as the rows that store it, and the ids to push once they commit (pure: no I/O).

Each node becomes a ``workflow_nodes`` row and its tasks (one, or one per item of a map over a
list; none yet for a map over a dep's result, made when that node is released); each dep an
edge. Roots are ``released`` with their tasks ``queued`` (pushed once committed), every other
node ``blocked``: migration 0025's trigger releases them as their deps end. The callbacks are
nodes ``on_failure`` and ``finally`` of their own kind, without edges.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from taskmesh.ids import uuid7
from taskmesh.limits.book import LimitBook
from taskmesh.tasks.enqueue_plan import TaskRows
from taskmesh.tasks.models import PushTarget
from taskmesh.tasks.states import NodeKind, NodeStatus, TaskStatus
from taskmesh.tasks.validation import dump_json
from taskmesh.workflows.spec import MapFrom, NodeSpec, TaskOptions, WorkflowLimits, WorkflowSpec

Resolve = Callable[[str, str | None, int | None], tuple[str, int]]
"""``(task name, queue asked for, max_retries asked for) -> (queue, max_retries)``: a task's defaults
as an enqueue resolves them (the request's, else its handler's, else the instance's)."""


@dataclass(slots=True)
class WorkflowPlan:
    """What one submission writes, and what it answers."""

    workflow_id: uuid.UUID
    trace_id: str
    context_json: str | None
    nodes_json: str
    parents: list[str]
    children: list[str]
    tasks: TaskRows
    """The workflow's tasks as an enqueue plan's rows (``task_insert_many`` stores them)."""
    push: list[PushTarget]
    answer: dict[str, str | list[str]]
    """``{node id: task id, or a map's task ids}`` as the 201 answer names them."""
    empty_root_maps: bool
    """A root is a map over no items: it has ended already, and its workflow must advance at once."""


def plan(
    spec: WorkflowSpec, trace_id: str, resolve: Resolve, limits: WorkflowLimits, book: LimitBook | None = None
) -> WorkflowPlan:
    """The rows of ``spec`` (validated by :func:`~taskmesh.workflows.spec.parse_workflow`).

    :param trace_id: the workflow's trace id, which every task of it carries.
    :param resolve: a task's queue and max_retries as an enqueue resolves them.
    :param book: the task limits in force: each task's limit keys, as an enqueue's (a map over a dep's
        result holds its node's in its template: those not keyed by a payload path).
    :raises InvalidTaskError: a payload is not storable JSON (``nodes[i].payload``).
    """
    workflow_id = uuid7()
    tasks = TaskRows()
    push: list[PushTarget] = []
    answer: dict[str, str | list[str]] = {}
    rows: list[dict[str, Any]] = []
    parents: list[str] = []
    children: list[str] = []
    empty_root_maps = False
    callbacks: list[tuple[NodeKind, TaskOptions]] = []
    if spec.on_failure is not None:
        callbacks.append((NodeKind.ON_FAILURE, spec.on_failure))
    if spec.finally_ is not None:
        callbacks.append((NodeKind.FINALLY, spec.finally_))
    entries: list[tuple[str, NodeKind, TaskOptions, NodeSpec | None]] = [
        (n.id, NodeKind.MAP if n.map is not None else NodeKind.TASK, n, n) for n in spec.nodes
    ]
    entries += [(kind.value, kind, options, None) for kind, options in callbacks]
    for position, (node_id, kind, options, node) in enumerate(entries):
        where = f"nodes[{position}]." if node is not None else f"{node_id}."
        queue, max_retries = resolve(options.task, options.queue_name or spec.queue_name, options.max_retries)
        priority = options.priority if options.priority is not None else 0
        root = node is not None and not node.deps
        released = root
        template: dict[str, Any] = {
            "queue": queue,
            "priority": priority,
            "max_retries": max_retries,
            "timeout": options.timeout,
            "max_items": limits.map_max_items,
        }
        if book:
            later = book.keys_for(
                queue=queue, name=options.task, tenant_id=spec.tenant_id, payload=None, payload_known=False
            )
            if later:
                template["limit_keys"] = later
        map_from = node.map.from_ if node is not None and isinstance(node.map, MapFrom) else None
        rows.append(
            {
                "node_id": node_id,
                "position": position,
                "kind": kind.value,
                "task_name": options.task,
                "deps": node.deps if node is not None else [],
                "on_dep_failure": node.on_dep_failure.value if node is not None else "fail",
                "map_from": map_from,
                "template": template,
                "status": NodeStatus.RELEASED if released else NodeStatus.BLOCKED,
            }
        )
        if node is not None:
            for dep in node.deps:
                parents.append(dep)
                children.append(node_id)
        if map_from is not None:
            answer[node_id] = []
            continue
        if node is not None and isinstance(node.map, list):
            values: list[Any] = list(node.map)
            payloads = [dump_json(item, f"{where}map[{i}]") for i, item in enumerate(node.map)]
            indexes: list[int | None] = list(range(len(payloads)))
            empty_root_maps = empty_root_maps or (root and not payloads)
        else:
            values = [options.payload if options.payload is not None else {}]
            payloads = [dump_json(values[0], f"{where}payload")]
            indexes = [None]
        status = TaskStatus.QUEUED if released else TaskStatus.BLOCKED
        ids = []
        for payload, value, index in zip(payloads, values, indexes, strict=True):
            keys = (
                book.keys_for(queue=queue, name=options.task, tenant_id=spec.tenant_id, payload=value) if book else None
            )
            task_id = tasks.add(
                name=options.task,
                queue=queue,
                priority=priority,
                payload=payload,
                max_retries=max_retries,
                tenant_id=spec.tenant_id,
                trace_id=trace_id,
                status=status,
                workflow_id=workflow_id,
                workflow_node=node_id,
                map_index=index,
                timeout=options.timeout,
                limit_keys=keys,
            )
            ids.append(task_id)
            if released:
                push.append(PushTarget(task_id, queue, priority, None, keys))
        answer[node_id] = [str(i) for i in ids] if kind == NodeKind.MAP else str(ids[0])
    return WorkflowPlan(
        workflow_id=workflow_id,
        trace_id=trace_id,
        context_json=orjson.dumps(spec.context).decode() if spec.context is not None else None,
        nodes_json=orjson.dumps(rows).decode(),
        parents=parents,
        children=children,
        tasks=tasks,
        push=push,
        answer=answer,
        empty_root_maps=empty_root_maps,
    )
