"""A workflow as submitted (``POST /api/v1/workflows``, ``client.workflow(...)``) and its validation.

Refused before anything is written, each with the field that says where
(:class:`~taskmesh.errors.InvalidTaskError`, answered 422): a field of the wrong shape
(``nodes[2].priority``), a duplicate node id, a dep that names no node, a cycle (the cycle is
named: ``a -> b -> a``), more nodes than ``workflow_max_nodes``, a map over more items than
``workflow_map_max_items``, a ``map.from`` that is not a dep of plain task node. Payloads are
checked against their handlers' models by the facade (:mod:`taskmesh.workflows.workflows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from taskmesh.errors import InvalidTaskError
from taskmesh.store.keys import PRIORITY_MAX
from taskmesh.tasks.states import DepFailure, NodeKind
from taskmesh.tasks.validation import MAX_RETRIES_LIMIT, NAME_REGEX, StrictInt, check_json, field_errors

NODE_ID_REGEX = r"^[A-Za-z0-9_.:-]{1,128}$"
RESERVED_IDS = frozenset({NodeKind.ON_FAILURE.value, NodeKind.FINALLY.value})
"""Node ids the callbacks take (``nodes`` of the answer names them so)."""
MAX_TIMEOUT_SECONDS = 7 * 86400.0
MAX_NODES = 10_000
"""Default of the ``workflow_max_nodes`` setting."""
MAP_MAX_ITEMS = 10_000
"""Default of the ``workflow_map_max_items`` setting."""


@dataclass(frozen=True, slots=True)
class WorkflowLimits:
    """The bounds of a workflow (settings ``workflow_max_nodes``, ``workflow_map_max_items``)."""

    max_nodes: int = MAX_NODES
    map_max_items: int = MAP_MAX_ITEMS


class MapFrom(BaseModel):
    """``"map": {"from": "extract"}``: one task per element of the list node ``extract`` returns."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    from_: str = Field(alias="from", pattern=NODE_ID_REGEX)


class TaskOptions(BaseModel):
    """Where and how a node's tasks run (each defaults as a task's would: its handler's, then the instance's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field(pattern=NAME_REGEX, description="Handler name of the node's tasks.")
    payload: Any = Field(default=None, description="Any JSON value; a map node's tasks get their item instead.")
    queue_name: str | None = Field(default=None, pattern=NAME_REGEX)
    priority: StrictInt | None = Field(default=None, ge=0, le=PRIORITY_MAX)
    max_retries: StrictInt | None = Field(default=None, ge=0, le=MAX_RETRIES_LIMIT)
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_SECONDS, allow_inf_nan=False)


class NodeSpec(TaskOptions):
    """One node of the graph."""

    id: str = Field(pattern=NODE_ID_REGEX)
    deps: list[str] = Field(default_factory=list, max_length=MAX_NODES)
    on_dep_failure: DepFailure = DepFailure.FAIL
    map: list[Any] | MapFrom | None = None


class WorkflowSpec(BaseModel):
    """The body of ``POST /api/v1/workflows``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=NAME_REGEX)
    dedup_key: str | None = Field(default=None, min_length=1, max_length=512)
    tenant_id: str | None = Field(default=None, min_length=1, max_length=128)
    queue_name: str | None = Field(default=None, pattern=NAME_REGEX, description="Every node's default queue.")
    context: Any = Field(default=None, description="Any JSON value, handed to every task as ctx.workflow['context'].")
    nodes: list[NodeSpec] = Field(min_length=1)
    on_failure: TaskOptions | None = None
    finally_: TaskOptions | None = Field(default=None, alias="finally")
    trace_id: str | None = Field(default=None, min_length=1, max_length=128)


def parse_workflow(data: Any, limits: WorkflowLimits | None = None) -> WorkflowSpec:
    """Validate a decoded JSON body as a :class:`WorkflowSpec`, graph included.

    :raises InvalidTaskError: the first problem, naming its field (``nodes[2].deps``) and, for a
        graph's problem, the node; ``errors`` lists every problem pydantic found.
    """
    limits = limits or WorkflowLimits()
    if not isinstance(data, dict):
        raise InvalidTaskError("body", "must be a JSON object")
    nodes = data.get("nodes")
    if isinstance(nodes, list) and len(nodes) > limits.max_nodes:
        raise InvalidTaskError(
            "nodes", f"{len(nodes)} nodes, more than the workflow_max_nodes setting ({limits.max_nodes})"
        )
    if "context" in data:
        check_json(data["context"], "context")
    for i, node in enumerate(nodes if isinstance(nodes, list) else []):
        if isinstance(node, dict) and "map" in node and not isinstance(node["map"], list | dict):
            raise InvalidTaskError(f"nodes[{i}].map", 'must be a list of items or {"from": "<node id>"}')
        if isinstance(node, dict):
            for key in ("payload", "map"):
                if key in node:
                    check_json(node[key], f"nodes[{i}].{key}")
    for key in ("on_failure", "finally"):
        callback = data.get(key)
        if isinstance(callback, dict) and "payload" in callback:
            check_json(callback["payload"], f"{key}.payload")
    try:
        spec = WorkflowSpec.model_validate(data)
    except ValidationError as exc:
        errors = [
            (_field(err["loc"]), message) for err, (_, message) in zip(exc.errors(), field_errors(exc), strict=True)
        ]
        raise InvalidTaskError(errors[0][0], errors[0][1], errors) from None
    check_graph(spec, limits)
    return spec


def _field(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as the body's field: ``nodes[2].map.from`` (a union's member names dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in {"list[any]", "MapFrom"}:
            continue
        else:
            out += f".{part}" if out else part
    return out or "body"


def check_graph(spec: WorkflowSpec, limits: WorkflowLimits) -> None:
    """Refuse a graph that cannot run: duplicate or reserved ids, unknown deps, a map's bad source, a cycle.

    :raises InvalidTaskError: naming the node's field.
    """
    index: dict[str, int] = {}
    for i, node in enumerate(spec.nodes):
        if node.id in RESERVED_IDS:
            raise InvalidTaskError(f"nodes[{i}].id", f"{node.id!r} is the id of the workflow's {node.id} callback")
        if node.id in index:
            raise InvalidTaskError(f"nodes[{i}].id", f"duplicate node id {node.id!r} (also nodes[{index[node.id]}])")
        index[node.id] = i
    for i, node in enumerate(spec.nodes):
        source = node.map.from_ if isinstance(node.map, MapFrom) else None
        for dep in node.deps:
            if dep not in index and dep == source:  # the source named first: what the author wrote
                raise InvalidTaskError(f"nodes[{i}].map.from", f"node {node.id!r} maps over {dep!r}, which is no node")
            if dep not in index:
                raise InvalidTaskError(f"nodes[{i}].deps", f"node {node.id!r} depends on {dep!r}, which is no node")
            if dep == node.id:
                raise InvalidTaskError(f"nodes[{i}].deps", f"node {node.id!r} depends on itself")
        if len(set(node.deps)) < len(node.deps):
            raise InvalidTaskError(f"nodes[{i}].deps", f"node {node.id!r} names a dep twice")
        if isinstance(node.map, list):
            if len(node.map) > limits.map_max_items:
                raise InvalidTaskError(
                    f"nodes[{i}].map",
                    f"node {node.id!r} maps over {len(node.map)} items, more than the workflow_map_max_items "
                    f"setting ({limits.map_max_items})",
                )
        if node.map is not None and node.payload is not None:
            raise InvalidTaskError(
                f"nodes[{i}].payload", f"node {node.id!r} is a map: each of its tasks gets its item as payload"
            )
        if isinstance(node.map, MapFrom):
            source = node.map.from_
            if source not in index:
                raise InvalidTaskError(
                    f"nodes[{i}].map.from", f"node {node.id!r} maps over {source!r}, which is no node"
                )
            if source not in node.deps:
                raise InvalidTaskError(
                    f"nodes[{i}].map.from", f"node {node.id!r} maps over {source!r}, which must be one of its deps"
                )
            if spec.nodes[index[source]].map is not None:
                raise InvalidTaskError(
                    f"nodes[{i}].map.from",
                    f"node {node.id!r} maps over {source!r}, a map node: map over a plain task node's result",
                )
    cycle = find_cycle(spec.nodes)
    if cycle:
        first = index[cycle[0]]
        raise InvalidTaskError(
            f"nodes[{first}].deps", "the deps form a cycle (each depends on the next): " + " -> ".join(cycle)
        )


def find_cycle(nodes: list[NodeSpec]) -> list[str]:
    """A cycle of the deps as node ids, each depending on the next and the first repeated at the end
    (``[a, b, a]``: ``a`` depends on ``b``, which depends on ``a``); ``[]`` when none.

    Iterative depth-first search (10,000 nodes in a chain must not hit Python's recursion limit).
    """
    deps = {n.id: n.deps for n in nodes}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in deps:
        if state.get(root):
            continue
        path: list[str] = [root]
        stack: list[int] = [0]
        state[root] = 1
        while path:
            node, at = path[-1], stack[-1]
            if at < len(deps[node]):
                stack[-1] += 1
                dep = deps[node][at]
                if state.get(dep) == 1:
                    return [*path[path.index(dep) :], dep]  # each depends on the next
                if not state.get(dep):
                    state[dep] = 1
                    path.append(dep)
                    stack.append(0)
            else:
                state[node] = 2
                path.pop()
                stack.pop()
    return []


def roots(spec: WorkflowSpec) -> list[str]:
    """The ids of the nodes with no deps: their tasks are queued at submission."""
    return [n.id for n in spec.nodes if not n.deps]
