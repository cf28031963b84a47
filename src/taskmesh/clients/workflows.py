"""The workflow builder both Python clients hand out: nodes added one call at a time, sent as one body.

:class:`WorkflowBuilder` makes the body of ``POST /api/v1/workflows`` (the shape the
workflow facade parses too) and refuses locally what is cheap to see before anything
is sent, in the words of the server's own check (``taskmesh.workflows.spec``): a node id
given twice or reserved (``on_failure``, ``finally``), a dep naming no node of the
workflow; and what only a Python call can get wrong: a map without exactly one of
``items`` and ``from_``, a callback given twice. Everything else (names, payloads,
priorities, cycles) is for the server to judge. It reads and writes nothing itself:
:meth:`WorkflowBuilder.submit` hands the body to the client that made the builder.

The helpers after it check the arguments of the clients' other workflow methods as the HTTP
API does (an id, the listing's filters, a cancel's reason).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

from taskmesh.errors import InvalidTaskError
from taskmesh.tasks.validation import check_json

R = TypeVar("R")

RESERVED_NODE_IDS = ("on_failure", "finally")
"""Node ids the callbacks take in the server's answer; no node of the graph may have them."""
ON_DEP_FAILURE = ("fail", "ignore", "continue")
"""What a node does when a dep of it failed: be skipped (the default), run once every dep ended with
``None`` for that dep's result, or run at the first failure without waiting for the other deps."""


class WorkflowBuilder(Generic[R]):
    """A workflow to submit: a name, its options, and nodes added by chained calls.

    Made by ``Client.workflow(...)`` (``submit()`` returns an awaitable) or
    ``SyncClient.workflow(...)`` (``submit()`` blocks), never directly::

        answer = await (
            client.workflow("nightly-report", dedup_key="2026-12-01")
            .task("extract", "reports.extract", {"day": "2026-12-01"})
            .map("render", "reports.render", from_="extract")
            .task("publish", "reports.publish", deps=["render"])
            .on_failure("alerts.page", {"team": "data"})
            .submit()
        )

    :param name: the workflow's name (not unique; listed and searched by).
    :param submit: what sends the body (:meth:`to_json`) and gives the server's answer.
    :param dedup_key: a second submit with the same key (and tenant) answers the first workflow,
        with ``"deduplicated": true``.
    :param tenant_id: the tenant of the workflow and of every task it makes.
    :param queue_name: the queue of every node that names none (default: each task's own default).
    :param context: any JSON value, given to every handler of the workflow as ``ctx.workflow["context"]``.
    :param trace_id: the trace its tasks join (default: a new one).
    """

    def __init__(
        self,
        name: str,
        submit: Callable[[dict[str, Any]], R],
        *,
        dedup_key: str | None = None,
        tenant_id: str | None = None,
        queue_name: str | None = None,
        context: Any = None,
        trace_id: str | None = None,
    ) -> None:
        self._name = name
        self._submit = submit
        self._options = {
            "dedup_key": dedup_key,
            "tenant_id": tenant_id,
            "queue_name": queue_name,
            "context": context,
            "trace_id": trace_id,
        }
        self._nodes: list[dict[str, Any]] = []
        self._index: dict[str, int] = {}  # node id -> position, so that 10,000 nodes are no quadratic check
        self._callbacks: dict[str, dict[str, Any]] = {}

    def task(
        self,
        node_id: str,
        task: str,
        payload: Any = None,
        *,
        deps: Iterable[str] = (),
        on_dep_failure: str | None = None,
        queue_name: str | None = None,
        priority: int | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
    ) -> WorkflowBuilder[R]:
        """Add a node that runs one task once its deps have ended; returns the builder.

        :param node_id: the node's id in the workflow (its deps, the answer and ``ctx.parents`` name it).
        :param task: the task name its handler is registered under.
        :param payload: any JSON value (default ``{}``).
        :param deps: ids of the nodes it waits for, added before or after this one; their
            results reach its handler as ``ctx.parents``.
        :param on_dep_failure: ``fail`` (default: skipped), ``ignore`` or ``continue``.
        :param priority: 0..1000, higher runs first.
        :param timeout: seconds a run of it may take.
        :raises InvalidTaskError: ``node_id`` is already a node's or reserved (``nodes[i].id``), or
            ``on_dep_failure`` is not one of the three (``nodes[i].on_dep_failure``).
        """
        self._nodes.append(
            self._node(node_id, task, payload, deps, on_dep_failure, queue_name, priority, max_retries, timeout)
        )
        return self

    def map(
        self,
        node_id: str,
        task: str,
        items: Sequence[Any] | None = None,
        *,
        from_: str | None = None,
        deps: Iterable[str] = (),
        on_dep_failure: str | None = None,
        queue_name: str | None = None,
        priority: int | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
    ) -> WorkflowBuilder[R]:
        """Add a node that runs one task per item (each item is that task's payload); returns the builder.

        The nodes that depend on it get its results as one list, in the items' order.

        :param items: the items, known now (a list or tuple of JSON values).
        :param from_: instead of ``items``: the node whose result (a list) gives the items once it
            has completed; added to ``deps`` when not there (the server wants it among them).
        :raises InvalidTaskError: neither or both of ``items`` and ``from_``, or ``items`` not a
            list or tuple (``nodes[i].map``); else as :meth:`task`.
        """
        field = f"nodes[{len(self._nodes)}].map"
        if (items is None) == (from_ is None):
            raise InvalidTaskError(field, "give items or from_, one of them")
        if items is not None and not isinstance(items, list | tuple):
            raise InvalidTaskError(field, f"items must be a list or a tuple, not {type(items).__name__}")
        dep_list = [deps] if isinstance(deps, str) else list(deps)
        if from_ is not None and from_ not in dep_list:
            dep_list.append(from_)
        node = self._node(node_id, task, None, dep_list, on_dep_failure, queue_name, priority, max_retries, timeout)
        node["map"] = list(items) if items is not None else {"from": from_}
        self._nodes.append(node)
        return self

    def on_failure(
        self,
        task: str,
        payload: Any = None,
        *,
        queue_name: str | None = None,
        priority: int | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
    ) -> WorkflowBuilder[R]:
        """Run ``task`` once when the workflow has failed (a node failed, after the others ended).

        Its handler sees ``ctx.workflow["summary"]``, each node's state by id; returns the builder.

        :param queue_name: as :meth:`task`'s, and so are ``priority``, ``max_retries`` and ``timeout``.
        :raises InvalidTaskError: an ``on_failure`` task was given already (``on_failure``).
        """
        options = {"queue_name": queue_name, "priority": priority, "max_retries": max_retries, "timeout": timeout}
        return self._callback("on_failure", task, payload, options)

    def finally_(
        self,
        task: str,
        payload: Any = None,
        *,
        queue_name: str | None = None,
        priority: int | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
    ) -> WorkflowBuilder[R]:
        """Run ``task`` once when the workflow has ended, completed or failed (after ``on_failure``).

        :param queue_name: as :meth:`task`'s, and so are ``priority``, ``max_retries`` and ``timeout``.
        :raises InvalidTaskError: a ``finally`` task was given already (``finally``).
        """
        options = {"queue_name": queue_name, "priority": priority, "max_retries": max_retries, "timeout": timeout}
        return self._callback("finally", task, payload, options)

    def to_json(self) -> dict[str, Any]:
        """The body of ``POST /api/v1/workflows``: options and fields left unset are left out. Also an
        item of ``client.submit_workflows([...])`` and of ``POST /api/v1/workflows:batch``, which store
        many built workflows at once.

        :returns: a new dict each call (its node lists too); payloads, items and context are the values
            given, not copies.
        :raises InvalidTaskError: a dep names no node of the workflow (``nodes[i].deps``; a map's
            ``from_``: ``nodes[i].map.from``).
        """
        for i, node in enumerate(self._nodes):
            source = node["map"].get("from") if isinstance(node.get("map"), dict) else None
            for dep in node.get("deps", ()):
                if dep not in self._index and dep == source:  # named by from_, as the server says it
                    raise InvalidTaskError(
                        f"nodes[{i}].map.from", f"node {node['id']!r} maps over {dep!r}, which is no node"
                    )
                if dep not in self._index:
                    raise InvalidTaskError(
                        f"nodes[{i}].deps", f"node {node['id']!r} depends on {dep!r}, which is no node"
                    )
        body: dict[str, Any] = {"name": self._name}
        body.update({k: v for k, v in self._options.items() if v is not None})
        body["nodes"] = [_fresh(node) for node in self._nodes]
        for key, callback in self._callbacks.items():
            body[key] = dict(callback)
        return body

    def submit(self) -> R:
        """Send the workflow: its tasks without deps are queued at once, the others wait.

        With ``Client`` this returns an awaitable; with ``SyncClient`` it blocks. The answer is the
        API's: ``{"workflow_id", "status", "trace_id", "nodes": {node id: task id, or a map's list}}``,
        with ``"deduplicated": True`` when ``dedup_key`` repeats.

        :raises InvalidTaskError: as :meth:`to_json`, or the server's refusal (field and message as
            the HTTP API's 422); nothing is written then.
        """
        return self._submit(self.to_json())

    def _node(
        self,
        node_id: str,
        task: str,
        payload: Any,
        deps: Iterable[str],
        on_dep_failure: str | None,
        queue_name: str | None,
        priority: int | None,
        max_retries: int | None,
        timeout: float | None,
    ) -> dict[str, Any]:
        """One node's fields, once its id is free and its ``on_dep_failure`` known (see :meth:`task`)."""
        index = len(self._nodes)
        if node_id in RESERVED_NODE_IDS:
            raise InvalidTaskError(f"nodes[{index}].id", f"{node_id!r} is the id of the workflow's {node_id} callback")
        if node_id in self._index:
            raise InvalidTaskError(
                f"nodes[{index}].id", f"duplicate node id {node_id!r} (also nodes[{self._index[node_id]}])"
            )
        if on_dep_failure is not None and on_dep_failure not in ON_DEP_FAILURE:
            raise InvalidTaskError(f"nodes[{index}].on_dep_failure", "Input should be 'fail', 'ignore' or 'continue'")
        # A str is an iterable of its letters: deps="extract" means the one node, not seven.
        dep_list = [deps] if isinstance(deps, str) else list(deps)
        node: dict[str, Any] = {"id": node_id, "task": task}
        optional = {
            "payload": payload,
            "deps": dep_list or None,
            "on_dep_failure": on_dep_failure,
            "queue_name": queue_name,
            "priority": priority,
            "max_retries": max_retries,
            "timeout": timeout,
        }
        node.update({k: v for k, v in optional.items() if v is not None})
        self._index[node_id] = index
        return node

    def _callback(self, key: str, task: str, payload: Any, options: dict[str, Any]) -> WorkflowBuilder[R]:
        if key in self._callbacks:
            raise InvalidTaskError(key, "given twice: a workflow has one")
        given = {"payload": payload, **options}
        self._callbacks[key] = {"task": task, **{k: v for k, v in given.items() if v is not None}}
        return self


def _fresh(node: dict[str, Any]) -> dict[str, Any]:
    """A node with new containers of its own (deps, a map's items or source), so that a caller
    changing one body changes neither the builder nor another body."""
    out = dict(node)
    for key in ("deps", "map"):
        if key in out:
            out[key] = list(out[key]) if isinstance(out[key], list) else dict(out[key])
    return out


WorkflowRef = uuid.UUID | str | Mapping[str, Any]
"""A workflow as the clients' methods take it: its id, its id as text, or a submit's answer."""

WORKFLOW_STATUSES = ("running", "completed", "failed", "cancelled")
"""The statuses ``list_workflows`` filters by (``taskmesh.tasks.states.WorkflowStatus``)."""
REASON_MAX = 500
"""Most characters of a cancel's reason, as the API's ``POST /api/v1/workflows/{id}/cancel``."""


def workflow_ref(ref: WorkflowRef) -> uuid.UUID:
    """The workflow id of ``ref``.

    :raises InvalidTaskError: not a UUID (``workflow_id: must be a UUID``), as the API says it.
    """
    if isinstance(ref, uuid.UUID):
        return ref
    raw = ref.get("workflow_id") if isinstance(ref, Mapping) else ref
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        raise InvalidTaskError("workflow_id", "must be a UUID") from None


def list_filters(
    name: str | None,
    status: str | None,
    tenant_id: str | None,
    created_after: datetime | str | None,
    created_before: datetime | str | None,
) -> dict[str, Any]:
    """The filters of ``list_workflows`` as the facade's ``page`` takes them, checked as the API checks them.

    :param created_after: an aware datetime, or RFC 3339 text with an offset; so is ``created_before``.
    :returns: the filters given, times as aware datetimes.
    :raises InvalidTaskError: ``status`` not a workflow status, or a time without an offset.
    """
    if status is not None and status not in WORKFLOW_STATUSES:
        raise InvalidTaskError("status", f"must be one of {', '.join(WORKFLOW_STATUSES)}")
    out: dict[str, Any] = {
        key: value for key, value in (("name", name), ("status", status), ("tenant_id", tenant_id)) if value is not None
    }
    for key, value in (("created_after", created_after), ("created_before", created_before)):
        if value is None:
            continue
        at: datetime | None
        if isinstance(value, datetime):
            at = value
        else:
            try:
                at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            except ValueError:
                at = None
        if at is None or at.tzinfo is None:
            raise InvalidTaskError(key, "must be an RFC 3339 time with an offset")
        out[key] = at
    return out


def cancel_reason(reason: str | None) -> str | None:
    """``reason`` once it is one the API would take (at most 500 characters, no NUL).

    :raises InvalidTaskError: too long, or holding a NUL character (``reason``).
    """
    if reason is None:
        return None
    if len(reason) > REASON_MAX:
        raise InvalidTaskError("reason", f"String should have at most {REASON_MAX} characters")
    check_json(reason, "reason")
    return reason
