"""Typed calls of ``workflows.sql``: a workflow's rows, its page, its cancel, retry and repair."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import asyncpg

from taskmesh.store.sql import Queries


class WorkflowQueries(Queries):
    """Queries on ``workflows``, ``workflow_nodes``, ``workflow_edges`` and the tasks of workflows."""

    async def insert(
        self,
        workflow_id: uuid.UUID,
        name: str,
        tenant_id: str | None,
        dedup_key: str | None,
        trace_id: str,
        context_json: str | None,
    ) -> bool:
        """``workflow_insert``: whether the row was made (``False``: its dedup key is taken)."""
        return (
            await self._fetchval("workflow_insert", workflow_id, name, tenant_id, dedup_key, trace_id, context_json)
            is not None
        )

    async def find_by_dedup_key(self, dedup_key: str, tenant_id: str | None) -> asyncpg.Record | None:
        """``workflow_find_by_dedup_key``: ``id, status, trace_id`` of the workflow holding the key."""
        return await self._fetchrow("workflow_find_by_dedup_key", dedup_key, tenant_id or "")

    async def insert_many(
        self,
        workflow_ids: Sequence[uuid.UUID],
        names: Sequence[str],
        tenant_ids: Sequence[str | None],
        dedup_keys: Sequence[str | None],
        trace_ids: Sequence[str],
        contexts_json: Sequence[str | None],
    ) -> set[uuid.UUID]:
        """``workflow_insert_many``: one row per position of the sequences, in their order; the ids made
        (a row whose dedup key is taken is not)."""
        rows = await self._fetch(
            "workflow_insert_many",
            list(workflow_ids),
            list(names),
            list(tenant_ids),
            list(dedup_keys),
            list(trace_ids),
            list(contexts_json),
        )
        return {r["id"] for r in rows}

    async def find_by_dedup_keys(self, keys: Sequence[tuple[str, str | None]]) -> dict[tuple[str, str], asyncpg.Record]:
        """``workflow_find_by_dedup_keys``: ``{(dedup key, tenant or ''): id, status, trace_id}`` of the
        workflows holding the keys (``(dedup key, tenant)`` pairs)."""
        rows = await self._fetch("workflow_find_by_dedup_keys", [k for k, _ in keys], [t or "" for _, t in keys])
        return {(r["dedup_key"], r["tenant"]): r for r in rows}

    async def insert_nodes(self, workflow_id: uuid.UUID, nodes_json: str) -> None:
        """``workflow_insert_nodes``: ``nodes_json`` a JSON array of rows in ``workflow_nodes``' column names."""
        await self._execute("workflow_insert_nodes", workflow_id, nodes_json)

    async def insert_edges(self, workflow_id: uuid.UUID, parents: Sequence[str], children: Sequence[str]) -> None:
        """``workflow_insert_edges``: one edge per ``(parents[i], children[i])``."""
        await self._execute("workflow_insert_edges", workflow_id, list(parents), list(children))

    async def insert_nodes_many(self, workflow_ids: Sequence[uuid.UUID], nodes_json: Sequence[str]) -> None:
        """``workflow_insert_nodes_many``: ``nodes_json[i]`` the nodes of ``workflow_ids[i]``, as
        :meth:`insert_nodes` takes them."""
        await self._execute("workflow_insert_nodes_many", list(workflow_ids), list(nodes_json))

    async def insert_edges_many(
        self, workflow_ids: Sequence[uuid.UUID], parents: Sequence[str], children: Sequence[str]
    ) -> None:
        """``workflow_insert_edges_many``: one edge per ``(workflow_ids[i], parents[i], children[i])``."""
        await self._execute("workflow_insert_edges_many", list(workflow_ids), list(parents), list(children))

    async def task_map(
        self, workflow_ids: Sequence[uuid.UUID], most: int
    ) -> dict[uuid.UUID, list[tuple[str, str, list[uuid.UUID]]]]:
        """``workflow_task_map``: ``{workflow id: [(node id, kind, task ids), ...]}`` in node order, at most
        ``most`` ids per node."""
        out: dict[uuid.UUID, list[tuple[str, str, list[uuid.UUID]]]] = {w: [] for w in workflow_ids}
        for r in await self._fetch("workflow_task_map", list(workflow_ids), most):
            out[r["workflow_id"]].append((r["node_id"], r["kind"], list(r["ids"])))
        return out

    async def get(self, workflow_id: uuid.UUID) -> asyncpg.Record | None:
        """``workflow_get``."""
        return await self._fetchrow("workflow_get", workflow_id)

    async def nodes(self, workflow_id: uuid.UUID) -> list[asyncpg.Record]:
        """``workflow_nodes``: each node with its state, task counts (JSON text) and timings."""
        return await self._fetch("workflow_nodes", workflow_id)

    async def task_ids(self, workflow_id: uuid.UUID, most: int) -> dict[str, list[uuid.UUID]]:
        """``workflow_task_ids``: ``{node id: task ids}``, at most ``most`` per node."""
        return {r["workflow_node"]: list(r["ids"]) for r in await self._fetch("workflow_task_ids", workflow_id, most)}

    async def page(
        self,
        name: str | None,
        status: str | None,
        tenant_id: str | None,
        created_after: datetime | None,
        created_before: datetime | None,
        cursor: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[asyncpg.Record]:
        """``workflow_page``: newest first after ``cursor`` (``(created_at, id)`` of the last row seen)."""
        at, after = cursor if cursor is not None else (None, None)
        return await self._fetch(
            "workflow_page", name, status, tenant_id, created_after, created_before, at, after, limit
        )

    async def owner(self, workflow_id: uuid.UUID) -> asyncpg.Record | None:
        """``workflow_owner``: ``tenant_id, queues`` (``None``: no such workflow)."""
        return await self._fetchrow("workflow_owner", workflow_id)

    async def mark_cancelled(self, workflow_id: uuid.UUID, reason: str | None) -> str | None:
        """``workflow_mark_cancelled``: the status the workflow has now (``None``: no such workflow)."""
        status: str | None = await self._fetchval("workflow_mark_cancelled", workflow_id, reason)
        return status

    async def cancel_tasks(self, workflow_id: uuid.UUID) -> list[asyncpg.Record]:
        """``workflow_cancel_tasks``: the transition rows (``id, queue, priority, status, run_at``): ``cancelled``,
        or ``running`` for a running task asked to stop; nothing unless the workflow is cancelled."""
        return await self._fetch("workflow_cancel_tasks", workflow_id)

    async def status_counts(self, workflow_id: uuid.UUID) -> dict[str, int]:
        """``workflow_status_counts``: ``{task status: tasks}``."""
        return {r["status"]: r["n"] for r in await self._fetch("workflow_status_counts", workflow_id)}

    async def advance(self, workflow_ids: Sequence[uuid.UUID]) -> int:
        """``workflow_advance``: how many nodes were decided."""
        decided: int = await self._fetchval("workflow_advance", list(workflow_ids))
        return decided

    async def lock(self, workflow_id: uuid.UUID) -> asyncpg.Record | None:
        """``workflow_lock``: ``status, finished_at``, the row locked until the transaction ends."""
        return await self._fetchrow("workflow_lock", workflow_id)

    async def retry(self, workflow_id: uuid.UUID) -> tuple[int, int]:
        """``workflow_retry``: ``(tasks blocked again, nodes blocked again)``."""
        row = await self._fetchrow("workflow_retry", workflow_id)
        assert row is not None  # one row, always
        return row["tasks"], row["nodes"]

    async def find_stuck(self, most: int) -> list[uuid.UUID]:
        """``workflow_find_stuck``: ids of workflows a lost decision left behind."""
        return [r["id"] for r in await self._fetch("workflow_find_stuck", most)]

    async def run_inputs(self, workflow_ids: Sequence[uuid.UUID], nodes: Sequence[str]) -> list[asyncpg.Record]:
        """``workflow_run_inputs``: ``workflow_id, node, parent, kind, map_index, status, result`` (JSON text)."""
        return await self._fetch("workflow_run_inputs", list(workflow_ids), list(nodes))

    async def run_context(
        self, workflow_ids: Sequence[uuid.UUID], summarized: Sequence[uuid.UUID] = ()
    ) -> list[asyncpg.Record]:
        """``workflow_run_context``: ``id, name, context, summary`` (JSON texts; ``summary`` only for the
        workflows in ``summarized``, else null)."""
        return await self._fetch("workflow_run_context", list(workflow_ids), list(summarized))

    async def delete_finished(self, older_than_seconds: float, batch: int) -> int:
        """``workflow_delete_finished``: how many workflows left (with their tasks)."""
        deleted: int = await self._fetchval("workflow_delete_finished", older_than_seconds, batch)
        return deleted

    async def take_ended(self, most: int) -> list[asyncpg.Record]:
        """``workflow_take_ended``: ``name, outcome, seconds`` of workflows that ended, now taken."""
        return await self._fetch("workflow_take_ended", most)
