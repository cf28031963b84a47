"""What a claimed task of a workflow is handed: ``ctx.parents`` and ``ctx.workflow``.

Read after the claim, in two statements for the whole claimed batch (only when it holds tasks
of workflows: a batch of plain tasks pays nothing). The results handed to one task are bounded
(``workflow_parents_max_bytes``): over it the task's run fails with an error naming the setting,
and nothing is read into the handler.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import orjson

from taskmesh.store import PgStore
from taskmesh.tasks.models import ClaimedTask
from taskmesh.tasks.states import NodeKind, TaskStatus

PARENTS_MAX_BYTES = 4 * 1024 * 1024
"""Default bound of the JSON bytes one task is handed as its deps' results."""


async def attach(pg: PgStore, claimed: Sequence[ClaimedTask], max_bytes: int = PARENTS_MAX_BYTES) -> list[ClaimedTask]:
    """``claimed`` with ``parents`` and ``workflow`` filled in for the tasks of workflows.

    :param max_bytes: most bytes of results one task is handed; a task over it gets a ``defect``
        (its run fails at once, not retried).
    :raises StoreError: PostgreSQL failed (the caller's claim stands; the runs are reclaimed).
    """
    nodes = [t for t in claimed if t.workflow_id is not None and t.workflow_node is not None]
    if not nodes:
        return list(claimed)
    wf_ids = [t.workflow_id for t in nodes if t.workflow_id is not None]
    rows = await pg.workflows.run_inputs(wf_ids, [t.workflow_node or "" for t in nodes])
    sizes: dict[tuple[uuid.UUID, str], int] = defaultdict(int)
    deps: dict[tuple[uuid.UUID, str], dict[str, Any]] = defaultdict(dict)
    for r in rows:
        key = (r["workflow_id"], r["node"])
        text = r["result"] if r["status"] == TaskStatus.COMPLETED else None
        sizes[key] += len(text) if text is not None else 0
        if sizes[key] > max_bytes:
            continue  # over the bound: nothing more is decoded, the task fails below
        value = orjson.loads(text) if text is not None else None
        if r["kind"] == NodeKind.MAP:
            items = deps[key].setdefault(r["parent"], [])
            if r["map_index"] is not None:
                items.append(value)
        else:
            deps[key][r["parent"]] = value
    callbacks = {
        t.workflow_id
        for t in nodes
        if t.workflow_id is not None and t.workflow_node in (NodeKind.ON_FAILURE, NodeKind.FINALLY)
    }
    contexts = {r["id"]: r for r in await pg.workflows.run_context(sorted(set(wf_ids)), sorted(callbacks))}
    out: list[ClaimedTask] = []
    for task in claimed:
        if task.workflow_id is None or task.workflow_node is None:
            out.append(task)
            continue
        key = (task.workflow_id, task.workflow_node)
        meta = contexts.get(task.workflow_id)
        workflow: dict[str, Any] = {
            "id": str(task.workflow_id),
            "name": meta["name"] if meta is not None else None,
            "context": orjson.loads(meta["context"]) if meta is not None and meta["context"] is not None else None,
            "node": task.workflow_node,
            "map_index": task.map_index,
        }
        if task.workflow_node in (NodeKind.ON_FAILURE, NodeKind.FINALLY) and meta is not None:
            workflow["summary"] = orjson.loads(meta["summary"]) if meta["summary"] is not None else {}
        defect = task.defect
        if sizes[key] > max_bytes:
            defect = (
                f"the results of this task's deps hold {sizes[key]} bytes, more than the "
                f"workflow_parents_max_bytes setting ({max_bytes}): return less from them (a key into storage)"
            )
        out.append(dataclasses.replace(task, workflow=workflow, parents=deps.get(key, {}), defect=defect))
    return out
