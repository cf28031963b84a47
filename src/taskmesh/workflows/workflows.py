"""The workflow facade: submit a graph (or many at once), read it, list them, cancel one, retry one from
failure, repair.

Every write commits in PostgreSQL first; a submission of one workflow or of many is one transaction of
the same few statements (multi-row inserts of workflows, nodes, edges and tasks), and the roots of
the workflows it made are then pushed as any enqueue's tasks are
(:meth:`~taskmesh.tasks.tasks.Tasks.push`). Everything after (releases, skips, maps, the workflow's
end) happens in the transactions that end its tasks (migration 0025), whose released ids reach Redis
through ``enqueued_listener`` or, failing that, the reconciler.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from taskmesh.errors import InvalidTaskError, WorkflowNotFoundError, WorkflowStateError
from taskmesh.observability.logs import get_logger
from taskmesh.observability.tracing import new_trace_id
from taskmesh.security import audit
from taskmesh.tasks.enqueue_plan import TaskRows
from taskmesh.tasks.states import NodeKind, TaskStatus, WorkflowStatus
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec
from taskmesh.workflows.plan import WorkflowPlan, plan
from taskmesh.workflows.spec import MapFrom, WorkflowLimits, WorkflowSpec

log = get_logger("taskmesh.workflows")

TASK_IDS_PER_NODE = 1000
"""Most task ids of one map node a read lists (its counts cover all of them)."""
PAGE_MAX = 500


@dataclass(slots=True)
class PrepareMemo:
    """What the preparations of one batch share (:meth:`Workflows.prepare`): each task's defaults as
    resolved, and the task names whose handler takes an empty payload, each looked up once."""

    defaults: dict[tuple[str, str | None, int | None], tuple[str, int]] = field(default_factory=dict)
    empty_taken: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A workflow checked and planned (:meth:`Workflows.prepare`), ready for :meth:`Workflows.store`."""

    spec: WorkflowSpec
    plan: WorkflowPlan


@dataclass(frozen=True, slots=True)
class Submitted:
    """Answer of :meth:`Workflows.submit` (and of each item of :meth:`Workflows.submit_many`).

    ``created`` is ``False`` when the dedup key named an existing workflow, whose id, status, trace id
    and tasks (``nodes``, as its own submission answered them) are returned.
    """

    workflow_id: uuid.UUID
    status: str
    created: bool
    trace_id: str | None
    nodes: dict[str, str | list[str]]

    def to_dict(self) -> dict[str, Any]:
        """The API's answer."""
        body: dict[str, Any] = {
            "workflow_id": str(self.workflow_id),
            "status": self.status,
            "trace_id": self.trace_id,
            "nodes": self.nodes,
        }
        if not self.created:
            body["deduplicated"] = True
        return body


class Workflows:
    """Workflows over the task facade's stores.

    :param tasks: the task facade (its stores, handlers and defaults resolve each node's tasks).
    :param limits: the bounds of one workflow (settings ``workflow_max_nodes``, ``workflow_map_max_items``).
    """

    def __init__(self, tasks: Tasks, limits: WorkflowLimits | None = None) -> None:
        self.tasks = tasks
        self.pg = tasks.pg
        self.limits = limits or WorkflowLimits()

    # -- submit ------------------------------------------------------------------

    async def submit(self, spec: WorkflowSpec) -> Submitted:
        """Store the workflow, its nodes, edges and tasks in one transaction, then push its roots
        (:meth:`submit_many` of one).

        :raises InvalidTaskError: a payload does not fit its handler's model (``nodes[i].payload``,
            ``nodes[i].map[j]``); nothing is written.
        :raises StoreError: PostgreSQL failed; nothing was written.
        """
        [submitted] = await self.submit_many([spec], field_prefix="")
        return submitted

    async def submit_many(
        self, specs: Sequence[WorkflowSpec], *, field_prefix: str = "workflows[{i}]."
    ) -> list[Submitted]:
        """Store many workflows in one transaction of a few statements (whatever their number), then push
        all their roots at once: :meth:`prepare` each, then :meth:`store` them.

        :param specs: validated workflows (:func:`~taskmesh.workflows.spec.parse_workflow`).
        :param field_prefix: how a refused workflow's fields are named (``workflows[{i}].``:
            ``workflows[3].nodes[0].payload.id``).
        :returns: one answer per spec, in their order; a spec whose dedup key is taken, or repeats one of
            an earlier spec of ``specs``, answers that workflow (``created`` false) and stores nothing.
        :raises InvalidTaskError: the first spec a payload of which its handler's model refuses; nothing
            is written (all or nothing).
        :raises StoreError: PostgreSQL failed; nothing was written.
        """
        await self.tasks.learn()
        memo = PrepareMemo()
        prepared = [self.prepare(spec, field_prefix.format(i=i), memo) for i, spec in enumerate(specs)]
        return await self.store(prepared)

    def prepare(self, spec: WorkflowSpec, field_prefix: str = "", memo: PrepareMemo | None = None) -> Prepared:
        """Check ``spec``'s payloads against their handlers' models and plan its rows (no I/O; call
        ``await self.tasks.learn()`` first, so that handlers only other instances have are known).

        :param field_prefix: put before each refused field's name (``workflows[3].``).
        :param memo: shared by the preparations of one batch, so that what they have in common is
            looked up once.
        :raises InvalidTaskError: a payload its handler's model refuses, or one not storable as JSON
            (``nodes[i].payload``, ``nodes[i].map[j]``, ``finally.payload``, under ``field_prefix``).
        """
        memo = memo or PrepareMemo()

        def resolve(name: str, queue: str | None, max_retries: int | None) -> tuple[str, int]:
            found = memo.defaults.get((name, queue, max_retries))
            if found is None:
                found = memo.defaults[name, queue, max_retries] = self._resolve(name, queue, max_retries)
            return found

        try:
            self._check_payloads(spec, memo)
            planned = plan(spec, spec.trace_id or new_trace_id(), resolve, self.limits, self.tasks.limits)
        except InvalidTaskError as exc:
            raise exc.under(field_prefix) if field_prefix else exc from None
        return Prepared(spec, planned)

    async def store(self, prepared: Sequence[Prepared]) -> list[Submitted]:
        """Store prepared workflows in one transaction, then push their roots.

        The statements are the same few whatever the number of workflows: the workflows' rows (a taken
        dedup key makes none), the holders of the taken keys and their tasks (only when a key was taken),
        every node, every edge, every task, and the decision of workflows whose root is a map over no
        items. A dedup key repeated within ``prepared`` is the first one's: the later ones answer it.

        :returns: one answer per item, in their order.
        :raises WorkflowNotFoundError: the workflow holding a taken key was deleted between two
            statements (vanishingly rare); nothing was written.
        :raises StoreError: PostgreSQL failed; nothing was written.
        """
        first: dict[tuple[str, str], int] = {}
        repeats: dict[int, int] = {}  # index -> index of the first item with its key
        for i, p in enumerate(prepared):
            if p.spec.dedup_key is not None:
                repeats_of = first.setdefault((p.spec.dedup_key, p.spec.tenant_id or ""), i)
                if repeats_of != i:
                    repeats[i] = repeats_of
        # Keyed rows first, in (tenant, key) order: concurrent batches sharing keys wait for each other
        # in one order (no deadlock); the others after, in their order.
        order = sorted(
            (i for i in range(len(prepared)) if i not in repeats),
            key=lambda i: (
                (0, prepared[i].spec.tenant_id or "", prepared[i].spec.dedup_key or "")
                if prepared[i].spec.dedup_key is not None
                else (1, "", "")
            ),
        )
        answers: dict[int, Submitted] = {}
        async with self.pg.transaction() as tx:
            made = await tx.workflows.insert_many(
                [prepared[i].plan.workflow_id for i in order],
                [prepared[i].spec.name for i in order],
                [prepared[i].spec.tenant_id for i in order],
                [prepared[i].spec.dedup_key for i in order],
                [prepared[i].plan.trace_id for i in order],
                [prepared[i].plan.context_json for i in order],
            )
            lost = [i for i in order if prepared[i].plan.workflow_id not in made]
            if lost:
                answers.update(await _holders(tx, [prepared[i].spec for i in lost], lost))
            created = [prepared[i] for i in range(len(prepared)) if i not in repeats and i not in answers]
            if created:
                await tx.workflows.insert_nodes_many(
                    [p.plan.workflow_id for p in created], [p.plan.nodes_json for p in created]
                )
                edges = [(p.plan.workflow_id, len(p.plan.parents)) for p in created if p.plan.parents]
                if edges:
                    await tx.workflows.insert_edges_many(
                        [w for w, n in edges for _ in range(n)],
                        [parent for p in created for parent in p.plan.parents],
                        [child for p in created for child in p.plan.children],
                    )
                await tx.tasks.insert_many(TaskRows.joined([p.plan.tasks for p in created]).columns())
                empty_root_maps = [p.plan.workflow_id for p in created if p.plan.empty_root_maps]
                if empty_root_maps:
                    await tx.workflows.advance(empty_root_maps)
            for i, p in enumerate(prepared):
                if i in repeats:
                    continue
                answers.setdefault(
                    i,
                    Submitted(p.plan.workflow_id, WorkflowStatus.RUNNING.value, True, p.plan.trace_id, p.plan.answer),
                )
            for i, at in repeats.items():
                earlier = answers[at]
                answers[i] = Submitted(earlier.workflow_id, earlier.status, False, earlier.trace_id, earlier.nodes)
            out = [answers[i] for i in range(len(prepared))]
            _note_submitted(out, {p.spec.tenant_id for p in prepared if p.spec.tenant_id is not None})
        if created:
            await self.tasks.push([target for p in created for target in p.plan.push])
        self._count(created)
        return out

    def _count(self, created: Sequence[Prepared]) -> None:
        """The created workflows' ``workflows_submitted`` counts and ``workflow_submitted`` log lines."""
        metrics = self.tasks.metrics
        if metrics is not None:
            for name, n in Counter(p.spec.name for p in created).items():
                metrics.workflows_submitted.labels(metrics.workflow_label(name)).inc(n)
        for p in created:
            log.info(
                "workflow_submitted",
                workflow_id=str(p.plan.workflow_id),
                workflow=p.spec.name,
                nodes=len(p.spec.nodes),
                tasks=len(p.plan.tasks.ids),
                trace_id=p.plan.trace_id,
            )

    def _resolve(self, name: str, queue: str | None, max_retries: int | None) -> tuple[str, int]:
        fields: dict[str, Any] = {"name": name}
        if queue is not None:
            fields["queue_name"] = queue
        if max_retries is not None:
            fields["max_retries"] = max_retries
        resolved_queue, resolved_retries, _ = self.tasks.resolve_defaults(TaskSpec(**fields))
        return resolved_queue, resolved_retries

    def _check_payloads(self, spec: WorkflowSpec, memo: PrepareMemo) -> None:
        """Refuse a payload (or a map's item) its handler's declared type does not take.

        :raises InvalidTaskError: naming ``nodes[i].payload``, ``nodes[i].map[j]`` or ``finally.payload``.
        """
        for i, node in enumerate(spec.nodes):
            if isinstance(node.map, list):
                for j, item in enumerate(node.map):
                    self._check(node.task, item, f"nodes[{i}].map[{j}]")
            elif not isinstance(node.map, MapFrom):
                self._check(node.task, node.payload, f"nodes[{i}].payload", memo)
        for key, callback in (("on_failure", spec.on_failure), ("finally", spec.finally_)):
            if callback is not None:
                self._check(callback.task, callback.payload, f"{key}.payload", memo)

    def _check(self, name: str, payload: Any, where: str, memo: PrepareMemo | None = None) -> None:
        """Refuse ``payload`` (``None``: none given, checked as ``{}``) if ``name``'s handler does not take it.

        :raises InvalidTaskError: naming ``where``.
        """
        if payload is None:
            if memo is not None and name in memo.empty_taken:
                return
            self._check(name, {}, where)
            if memo is not None:
                memo.empty_taken.add(name)
            return
        try:
            self.tasks.check_payload(TaskSpec.model_construct(name=name, payload=payload))
        except InvalidTaskError as exc:
            errors = [(where + f.removeprefix("payload"), m) for f, m in exc.errors]
            raise InvalidTaskError(errors[0][0], errors[0][1], errors) from None

    # -- read --------------------------------------------------------------------

    async def owner(self, workflow_id: uuid.UUID) -> tuple[str | None, list[str]]:
        """The workflow's tenant and its nodes' queues.

        :raises WorkflowNotFoundError: no workflow has this id.
        """
        row = await self.pg.workflows.owner(workflow_id)
        if row is None:
            raise WorkflowNotFoundError(str(workflow_id))
        return row["tenant_id"], list(row["queues"])

    async def get(self, workflow_id: uuid.UUID) -> dict[str, Any]:
        """The workflow, its tasks counted by status, and each node with its state, tasks, timings and
        ``waiting_for`` (its deps not ended yet).

        :raises WorkflowNotFoundError: no workflow has this id.
        """
        row = await self.pg.workflows.get(workflow_id)
        if row is None:
            raise WorkflowNotFoundError(str(workflow_id))
        nodes = await self.pg.workflows.nodes(workflow_id)
        ids = await self.pg.workflows.task_ids(workflow_id, TASK_IDS_PER_NODE)
        states = {n["node_id"]: n["state"] for n in nodes}
        counts: dict[str, int] = {}
        out_nodes = []
        for n in nodes:
            node_counts: dict[str, int] = orjson.loads(n["counts"])
            for status, k in node_counts.items():
                counts[status] = counts.get(status, 0) + k
            kind = n["kind"]
            if kind in (NodeKind.ON_FAILURE, NodeKind.FINALLY):
                waits = [m for m, s in states.items() if m not in (NodeKind.ON_FAILURE, NodeKind.FINALLY)]
                waiting = [m for m in waits if states[m] in ("pending", "failing")] if n["status"] == "blocked" else []
            else:
                waiting = (
                    [d for d in n["deps"] if states.get(d) in ("pending", "failing")]
                    if n["status"] == "blocked"
                    else []
                )
            node: dict[str, Any] = {
                "id": n["node_id"],
                "task": n["task_name"],
                "kind": kind,
                "deps": list(n["deps"]),
                "on_dep_failure": n["on_dep_failure"],
                "map_from": n["map_from"],
                "status": n["status"],
                "state": _display_state(n["status"], n["state"], node_counts),
                "counts": node_counts,
                "started_at": _iso(n["started_at"]),
                "finished_at": _iso(n["finished_at"]) if n["state"] in ("succeeded", "failed") else None,
                "waiting_for": waiting,
                "error": n["error"] or n["task_error"],
            }
            task_ids = [str(i) for i in ids.get(n["node_id"], [])]
            if kind == NodeKind.MAP:
                node["task_ids"] = task_ids
            else:
                node["task_id"] = task_ids[0] if task_ids else None
            out_nodes.append(node)
        return {
            **_summary(row),
            "dedup_key": row["dedup_key"],
            "trace_id": row["trace_id"],
            "context": orjson.loads(row["context"]) if row["context"] is not None else None,
            "cancel_reason": row["cancel_reason"],
            "counts": counts,
            "nodes": out_nodes,
        }

    async def page(
        self,
        *,
        name: str | None = None,
        status: str | None = None,
        tenant_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        """A page of workflows, newest first: ``{"workflows": [...], "next_cursor": str | None}``.

        :param cursor: ``next_cursor`` of the page before.
        :raises InvalidTaskError: a cursor that is not one this returned, a limit out of 1..500.
        """
        if not 1 <= limit <= PAGE_MAX:
            raise InvalidTaskError("limit", f"must be 1 to {PAGE_MAX}")
        after = _parse_cursor(cursor) if cursor else None
        rows = await self.pg.workflows.page(name, status, tenant_id, created_after, created_before, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        items = [{**_summary(r), "counts": orjson.loads(r["counts"])} for r in rows]
        next_cursor = _cursor(rows[-1]["created_at"], rows[-1]["id"]) if more and rows else None
        return {"workflows": items, "next_cursor": next_cursor}

    # -- cancel and retry ------------------------------------------------------------

    async def cancel(self, workflow_id: uuid.UUID, reason: str | None = None) -> dict[str, Any]:
        """Cancel a workflow: no node of it is released from now on, its blocked and queued tasks end
        ``cancelled`` and its running ones are stopped through the cancel of one task (a ``def``
        handler's process too). Idempotent: a cancelled workflow answers again, ending what is left.

        :returns: ``{"workflow_id", "status", "cancelled": tasks ended now, "cancel_requested": running
            tasks asked to stop}``.
        :raises WorkflowNotFoundError: no workflow has this id.
        :raises WorkflowStateError: it is completed or failed (there is nothing to cancel).
        """
        status = await self.pg.workflows.mark_cancelled(workflow_id, reason)
        if status is None:
            raise WorkflowNotFoundError(str(workflow_id))
        if status != WorkflowStatus.CANCELLED:
            hint = "it is over: there is nothing to cancel"
            raise WorkflowStateError(
                str(workflow_id), status, hint + (" (retry it to run it again)" if status == "failed" else "")
            )
        rows = await self.pg.workflows.cancel_tasks(workflow_id)
        await self.pg.workflows.advance([workflow_id])  # over now when nothing of it runs
        await self.tasks.mirror(rows)
        ended = [r for r in rows if r["status"] == TaskStatus.CANCELLED]
        _note(workflow_id, None, reason=reason)
        log.info("workflow_cancelled", workflow_id=str(workflow_id), cancelled=len(ended), reason=reason)
        return {
            "workflow_id": str(workflow_id),
            "status": WorkflowStatus.CANCELLED.value,
            "cancelled": len(ended),
            "cancel_requested": len(rows) - len(ended),
        }

    async def retry(self, workflow_id: uuid.UUID) -> dict[str, Any]:
        """Retry a failed or cancelled workflow from where it failed, in one transaction: its failed,
        cancelled and skipped tasks get a fresh retry budget and wait again for their deps; those
        whose deps completed are released at once. Completed tasks keep their results and do not run again.

        :returns: ``{"workflow_id", "status": "running", "requeued": tasks made ready now, "reblocked":
            tasks waiting for their deps again}``.
        :raises WorkflowNotFoundError: no workflow has this id.
        :raises WorkflowStateError: it is running, completed, or cancelled with tasks still running.
        """
        async with self.pg.transaction() as tx:
            row = await tx.workflows.lock(workflow_id)
            if row is None:
                raise WorkflowNotFoundError(str(workflow_id))
            if row["status"] not in (WorkflowStatus.FAILED, WorkflowStatus.CANCELLED):
                raise WorkflowStateError(
                    str(workflow_id), row["status"], "only a failed or cancelled workflow can be retried"
                )
            if row["finished_at"] is None:
                raise WorkflowStateError(
                    str(workflow_id), row["status"], "tasks of it still run: retry it once they stopped"
                )
            reset, _ = await tx.workflows.retry(workflow_id)
            await tx.workflows.advance([workflow_id])
            counts = await tx.workflows.status_counts(workflow_id)
        _note(workflow_id, None)
        log.info("workflow_retried", workflow_id=str(workflow_id), tasks=reset)
        return {
            "workflow_id": str(workflow_id),
            "status": WorkflowStatus.RUNNING.value,
            "requeued": counts.get(TaskStatus.QUEUED, 0),
            "reblocked": counts.get(TaskStatus.BLOCKED, 0),
        }

    async def repair(self, most: int = 100) -> int:
        """Decide what a lost or missed decision left behind (the reconciler calls it each sweep): a blocked
        node whose deps all ended, a workflow over but not marked so, a cancelled one with tasks left.

        :returns: how many nodes were decided (each a repair: logged ``workflow_repaired``).
        :raises StoreError: PostgreSQL failed.
        """
        stuck = await self.pg.workflows.find_stuck(most)
        repaired = 0
        for workflow_id in stuck:
            async with self.pg.transaction() as tx:
                await tx.workflows.cancel_tasks(workflow_id)  # a cancelled one's tasks left over
                decided = await tx.workflows.advance([workflow_id])
            repaired += decided
            log.warning("workflow_repaired", workflow_id=str(workflow_id), nodes=decided)
        return repaired


async def _holders(tx: Any, specs: Sequence[WorkflowSpec], indexes: Sequence[int]) -> dict[int, Submitted]:
    """The answers of specs whose dedup key another workflow holds: that workflow's id, status, trace id
    and tasks, as its submission answered them (two statements whatever their number).

    :raises WorkflowNotFoundError: a holder was deleted between the insert and this read.
    """
    found = await tx.workflows.find_by_dedup_keys([(s.dedup_key, s.tenant_id) for s in specs])
    rows = []
    for spec in specs:
        row = found.get((spec.dedup_key, spec.tenant_id or ""))
        if row is None:  # deleted between the two statements: vanishingly rare, say so
            raise WorkflowNotFoundError(f"of dedup_key {spec.dedup_key!r} (deleted meanwhile)")
        rows.append(row)
    maps = await tx.workflows.task_map(list({r["id"] for r in rows}), TASK_IDS_PER_NODE)
    return {
        i: Submitted(row["id"], row["status"], False, row["trace_id"], _answer(maps[row["id"]]))
        for i, row in zip(indexes, rows, strict=True)
    }


def _answer(nodes: list[tuple[str, str, list[uuid.UUID]]]) -> dict[str, str | list[str]]:
    """``{node id: task id, or a map's task ids}`` of a stored workflow, as its submission answered."""
    return {
        node: [str(i) for i in ids] if kind == NodeKind.MAP else str(ids[0])
        for node, kind, ids in nodes
        if kind == NodeKind.MAP or ids
    }


def _display_state(status: str, state: str, counts: dict[str, int]) -> str:
    """One word for a node: ``blocked``, ``running`` (a task of it runs or is queued), ``succeeded``,
    ``failed``, ``skipped`` or ``cancelled``."""
    if status in ("skipped", "cancelled", "blocked"):
        return status
    if state in ("pending", "failing"):
        return "running"
    if state == "failed" and not counts.get("failed") and not counts.get("skipped") and counts.get("cancelled"):
        return "cancelled"  # stopped by a cancel, not failed by itself
    return state


def _summary(row: Any) -> dict[str, Any]:
    return {
        "workflow_id": str(row["id"]),
        "name": row["name"],
        "status": row["status"],
        "tenant_id": row["tenant_id"],
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
        "finished_at": _iso(row["finished_at"]),
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _cursor(created_at: datetime, workflow_id: uuid.UUID) -> str:
    return f"{created_at.isoformat()}~{workflow_id}"


def _parse_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        at, _, raw = cursor.partition("~")
        return datetime.fromisoformat(at), uuid.UUID(raw)
    except ValueError:
        raise InvalidTaskError("cursor", "not a cursor this listing returned (next_cursor)") from None


def _note(
    workflow_id: uuid.UUID, tenant_id: str | None, *, deduplicated: bool = False, reason: str | None = None
) -> None:
    """What the request's audit event records about the workflow (nothing outside a request)."""
    event = audit.CURRENT.get()
    if event is None:
        return
    event.resource_type, event.resource_id = "workflow", str(workflow_id)
    event.tenant_id = event.tenant_id or tenant_id
    if reason is not None:
        event.details["reason"] = reason
    if deduplicated:
        event.details["deduplicated"] = True


def _note_submitted(out: Sequence[Submitted], tenants: Collection[str]) -> None:
    """What a submission tells the request's audit event (nothing outside a request): one workflow is
    the event's resource (as :func:`_note`); several are counted in its details, with the first ten
    created ids, as a batch of tasks is.

    :param tenants: the tenants the submitted workflows belong to.
    """
    if len(out) == 1:
        _note(out[0].workflow_id, next(iter(tenants), None), deduplicated=not out[0].created)
        return
    event = audit.CURRENT.get()
    if event is None:
        return
    created = [str(s.workflow_id) for s in out if s.created]
    event.tenant_id = event.tenant_id or (next(iter(tenants)) if len(tenants) == 1 else None)
    event.resource_type = event.resource_type or "workflow"
    event.details.update({"created": len(created), "deduplicated": len(out) - len(created), "sample": created[:10]})
