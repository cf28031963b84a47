"""A workflow's graph laid out on the server for inline SVG (no script, no library, nothing fetched).

A node's column is its depth: the longest path to it from a root (a node without deps), so every
edge goes rightwards. Within a column, nodes are ordered by the mean height of their deps (fewer
crossings), then in the order they were submitted; shorter columns are centred on the tallest. A
map node is one box with its tasks counted; the callbacks (``on_failure``, ``finally``) are laid
out apart, in a row of their own. Boxes carry text only (the template escapes it) and numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

BOX_W, BOX_H = 230, 64
"""A node's box, in SVG units (pixels: the SVG is drawn at its own size and scrolls sideways)."""
GAP_X, GAP_Y, PAD = 72, 18, 14
"""Between columns, between boxes of a column, around the drawing (SVG units)."""
DRAWN_MOST = 400
"""Most nodes drawn: a larger graph is listed in the table of nodes only."""
LINE_CHARS = 30
"""Characters that fit on one line of a box (12 px text, bold, in :data:`BOX_W`)."""
STATES = ("blocked", "running", "succeeded", "failed", "skipped", "cancelled")
"""A node's states (the API's ``state``), in the legend's order."""
COUNT_ORDER = ("completed", "failed", "running", "queued", "blocked", "cancelled", "skipped")
"""Task statuses in the order a map node's counts name them."""
CALLBACKS = ("on_failure", "finally")


@dataclass(frozen=True)
class Box:
    """One node's box: where it is, what it says and where a click goes.

    :ivar x: left edge, SVG units.
    :ivar y: top edge, SVG units.
    :ivar lines: its three lines (node id, task name, state or counts), each short enough for the box.
    :ivar tooltip: everything about the node, unshortened (its ``<title>``).
    :ivar href: the console page a click opens; ``None`` for a node without a task yet.
    """

    node_id: str
    kind: str
    state: str
    x: int
    y: int
    lines: tuple[str, str, str]
    tooltip: str
    href: str | None


@dataclass(frozen=True)
class Edge:
    """An arrow from a dep's box to its child's: an SVG path and its CSS class (``from-failed``: the dep
    failed; ``to-skipped``: the child was skipped)."""

    path: str
    css: str


@dataclass(frozen=True)
class Graph:
    """A laid-out graph: its boxes and edges and the size of the drawing (SVG units); its callbacks'
    boxes and their row's width. ``drawn`` is false when there were more than :data:`DRAWN_MOST` nodes
    (nothing is laid out)."""

    boxes: list[Box]
    edges: list[Edge]
    width: int
    height: int
    callbacks: list[Box]
    callbacks_width: int
    drawn: bool
    box_width: int = BOX_W
    box_height: int = BOX_H


def depths(nodes: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Each node's column: 0 for a root, else one more than its deepest dep (the longest path from a root).

    Deps naming no node in ``nodes`` are ignored; nodes on a cycle (which the API refuses) go one column
    past the deepest of the others, so that a bad answer still draws.
    """
    ids = {n["id"] for n in nodes}
    deps = {n["id"]: [d for d in n.get("deps", []) if d in ids and d != n["id"]] for n in nodes}
    depth: dict[str, int] = {}
    pending = [n["id"] for n in nodes]
    while pending:
        left = []
        for node_id in pending:
            if all(d in depth for d in deps[node_id]):
                depth[node_id] = max((depth[d] + 1 for d in deps[node_id]), default=0)
            else:
                left.append(node_id)
        if len(left) == len(pending):  # a cycle: nothing more resolves
            past = max(depth.values(), default=-1) + 1
            depth.update(dict.fromkeys(left, past))
            break
        pending = left
    return depth


def shown_state(node: dict[str, Any]) -> str:
    """The state a node is drawn in: the API's ``state``, except that a node whose tasks ended cancelled
    (none failed) is ``cancelled``; the API says ``failed`` for a node whose running task a cancel stopped,
    and an operator who cancelled it should see the word for what they did."""
    state = str(node.get("state", "blocked"))
    counts = node.get("counts") or {}
    if state == "failed" and counts.get("cancelled") and not counts.get("failed") and not node.get("error"):
        return "cancelled"
    return state if state in STATES else "blocked"


def count_words(counts: dict[str, int], most: int | None = None) -> str:
    """A map node's tasks in words: ``"12/25 completed, 1 failed, 12 running"``; ``"no tasks"`` for none.

    :param most: characters the words may take: the statuses after the first that does not fit are
        left out, ``…`` saying so (completed and the first other status, failed if any, are always
        named); ``None``: all of them.
    """
    total = sum(counts.values())
    if not total:
        return "no tasks"
    words = f"{counts.get('completed', 0):,}/{total:,} completed"
    rest = [f"{counts[s]:,} {s}" for s in COUNT_ORDER[1:] if counts.get(s)]
    rest += [f"{n:,} {s}" for s, n in sorted(counts.items()) if s not in COUNT_ORDER and n]
    for i, part in enumerate(rest):
        room = None if most is None else most - (0 if i == len(rest) - 1 else len(", …"))
        if i and room is not None and len(f"{words}, {part}") > room:
            return f"{words}, …"
        words = f"{words}, {part}"
    return words


def shorten(text: str, most: int = LINE_CHARS) -> str:
    """``text`` cut to ``most`` characters, its end replaced by ``…`` when cut."""
    return text if len(text) <= most else text[: most - 1] + "…"


def waiting_words(waiting: Sequence[str], most: int = LINE_CHARS) -> str:
    """``"waiting for a, b"``, naming as many deps as fit in ``most`` characters and counting the rest
    (``"waiting for extract +3"``)."""
    if not waiting:
        return "waiting"
    named: list[str] = []
    for i, dep in enumerate(waiting):
        tail = f" +{len(waiting) - i - 1}" if i < len(waiting) - 1 else ""
        candidate = "waiting for " + ", ".join([*named, dep])
        if named and len(candidate + tail) > most:
            return "waiting for " + ", ".join(named) + f" +{len(waiting) - len(named)}"
        named.append(dep)
    return shorten("waiting for " + ", ".join(named), most)


def state_words(node: dict[str, Any]) -> str:
    """The third line of a node's box: its tasks counted (a map), what it waits for (blocked), or its state
    (a running node whose task is only queued says ``queued``)."""
    state, counts = node["state"], node.get("counts") or {}
    if state == "blocked":
        if node.get("kind") in CALLBACKS:
            waiting = node.get("waiting_for") or []
            return f"waiting for {len(waiting)} node{'s' if len(waiting) != 1 else ''}" if waiting else "waiting"
        return waiting_words(node.get("waiting_for") or [])
    if node.get("kind") == "map":
        if node.get("error") and not counts:  # it could not make its tasks
            return f"failed: {node['error']}"
        return count_words(counts, LINE_CHARS)
    if state == "skipped" and node.get("kind") == "on_failure":
        return "skipped: nothing failed"
    if state == "running" and counts.get("queued") and not counts.get("running"):
        return "queued"
    return str(state)


def node_href(workflow_id: str, node: dict[str, Any]) -> str | None:
    """Where a click on the node goes: its task's page; a map node's chooser (its first failed task, else its
    first task); ``None`` while it has no task."""
    if node.get("kind") == "map":
        if not node.get("task_ids"):
            return None
        return f"/console/workflows/{workflow_id}/nodes/{quote(node['id'], safe='')}"
    task_id = node.get("task_id")
    return f"/console/tasks/{task_id}" if task_id else None


def tooltip(node: dict[str, Any]) -> str:
    """Everything the box shortens, one fact a line."""
    lines = [f"{node['id']} ({node.get('kind', 'task')}): {node['task']}", f"state: {node['state']}"]
    counts = node.get("counts") or {}
    if counts:
        lines.append("tasks: " + count_words(counts))
    if node.get("waiting_for"):
        lines.append("waiting for: " + ", ".join(node["waiting_for"]))
    if node.get("deps"):
        lines.append("deps: " + ", ".join(node["deps"]) + f" (on a failed dep: {node.get('on_dep_failure', 'fail')})")
    if node.get("map_from"):
        lines.append(f"one task per item of {node['map_from']}'s result")
    if node.get("error"):
        lines.append("error: " + node["error"])
    return "\n".join(lines)


def _box(workflow_id: str, node: dict[str, Any], x: int, y: int) -> Box:
    kind = str(node.get("kind", "task"))
    first = shorten(node["id"], LINE_CHARS - (6 if kind == "map" else 0))
    return Box(
        node_id=node["id"],
        kind=kind,
        state=node["state"],
        x=x,
        y=y,
        lines=(first, shorten(node["task"]), shorten(state_words(node))),
        tooltip=tooltip(node),
        href=node_href(workflow_id, node),
    )


def layout(workflow_id: str, nodes: Sequence[dict[str, Any]]) -> Graph:
    """The graph of a workflow's ``nodes`` (``GET /api/v1/workflows/{id}``'s) laid out in columns by depth.

    :param workflow_id: the workflow's id (a map node's box links to its chooser under it).
    :param nodes: the answer's nodes, in the order submitted.
    :returns: the boxes and edges, and the callbacks' boxes apart; ``drawn`` false (and nothing laid
        out) beyond :data:`DRAWN_MOST` nodes.
    """
    nodes = [{**n, "state": shown_state(n)} for n in nodes]
    main = [n for n in nodes if n.get("kind") not in CALLBACKS]
    callbacks = [n for n in nodes if n.get("kind") in CALLBACKS]
    if len(nodes) > DRAWN_MOST:
        return Graph([], [], 0, 0, [], 0, False)
    depth = depths(main)
    columns: list[list[dict[str, Any]]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for node in main:
        columns[depth[node["id"]]].append(node)
    tallest = max((len(c) for c in columns), default=0)
    pitch = BOX_H + GAP_Y
    centre: dict[str, float] = {}
    boxes: dict[str, Box] = {}
    for c, column in enumerate(columns):
        order = {n["id"]: i for i, n in enumerate(column)}

        def weight(node: dict[str, Any], order: dict[str, int] = order) -> tuple[float, int]:
            ys = [centre[d] for d in node.get("deps", []) if d in centre]
            return (sum(ys) / len(ys) if ys else 0.0, order[node["id"]])

        if c:
            column.sort(key=weight)
        top = PAD + (tallest - len(column)) * pitch // 2
        x = PAD + c * (BOX_W + GAP_X)
        for i, node in enumerate(column):
            y = top + i * pitch
            boxes[node["id"]] = _box(workflow_id, node, x, y)
            centre[node["id"]] = y + BOX_H / 2
    states = {n["id"]: n["state"] for n in main}
    edges = []
    for node in main:
        child = boxes[node["id"]]
        for dep in node.get("deps", []):
            parent = boxes.get(dep)
            if parent is None or dep == node["id"]:
                continue
            x1, y1 = parent.x + BOX_W, parent.y + BOX_H // 2
            x2, y2 = child.x - 3, child.y + BOX_H // 2  # the arrowhead's tip touches the box
            bend = max(24, (x2 - x1) // 2)
            css = " ".join(
                c
                for c, on in (("from-failed", states[dep] == "failed"), ("to-skipped", child.state == "skipped"))
                if on
            )
            edges.append(Edge(f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}", css))
    width = PAD * 2 + len(columns) * BOX_W + max(len(columns) - 1, 0) * GAP_X
    height = PAD * 2 + tallest * BOX_H + max(tallest - 1, 0) * GAP_Y
    called = [_box(workflow_id, n, PAD + i * (BOX_W + GAP_X), PAD) for i, n in enumerate(callbacks)]
    called_width = PAD * 2 + len(called) * BOX_W + max(len(called) - 1, 0) * GAP_X
    return Graph([boxes[n["id"]] for n in main], edges, width, height, called, called_width, True)
