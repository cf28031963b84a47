"""The console's workflow graph layout: columns by the longest path from a root, boxes that say what a node
is doing in the room they have, and where a click on each goes."""

from __future__ import annotations

from typing import Any

from taskmesh.console.workflow_graph import (
    BOX_W,
    DRAWN_MOST,
    GAP_X,
    PAD,
    count_words,
    depths,
    layout,
    state_words,
    waiting_words,
)

WID = "0190f3c2-0000-7000-8000-000000000001"


def node(node_id: str, *deps: str, kind: str = "task", state: str = "succeeded", **more: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": node_id,
        "task": f"t.{node_id}",
        "kind": kind,
        "deps": list(deps),
        "state": state,
        "counts": {},
        "waiting_for": [],
        "task_id": f"00000000-0000-7000-8000-{len(node_id):012d}" if kind != "map" else None,
    }
    return {**base, **more}


def test_a_nodes_column_is_its_longest_path_from_a_root_not_its_shortest() -> None:
    # a -> b -> c -> d, and a -> d directly: d sits after c, not next to b.
    nodes = [node("a"), node("b", "a"), node("c", "b"), node("d", "a", "c"), node("solo")]
    assert depths(nodes) == {"a": 0, "b": 1, "c": 2, "d": 3, "solo": 0}
    drawn = {b.node_id: b for b in layout(WID, nodes).boxes}
    assert drawn["d"].x == PAD + 3 * (BOX_W + GAP_X)
    assert drawn["solo"].x == drawn["a"].x == PAD


def test_every_edge_goes_rightwards_and_a_failed_deps_edges_are_marked() -> None:
    nodes = [
        node("a"),
        node("bad", "a", state="failed"),
        node("after", "bad", state="skipped"),
        node("sees", "bad", "a"),
    ]
    graph = layout(WID, nodes)
    assert len(graph.edges) == 4
    for edge in graph.edges:
        start, end = edge.path[1:].split(" C")[0], edge.path.rsplit(" ", 1)[1]
        assert float(end.split(",")[0]) > float(start.split(",")[0]), edge.path
    assert sorted(e.css for e in graph.edges) == ["", "", "from-failed", "from-failed to-skipped"]


def test_a_map_node_is_one_box_counting_its_tasks_and_the_callbacks_are_laid_out_apart() -> None:
    mapped = node(
        "square",
        "extract",
        kind="map",
        state="failed",
        counts={"completed": 12, "failed": 1, "running": 3, "queued": 9},
        task_ids=["t1", "t2"],
    )
    nodes = [node("extract"), mapped, node("on_failure", kind="on_failure"), node("finally", kind="finally")]
    graph = layout(WID, nodes)
    assert [b.node_id for b in graph.boxes] == ["extract", "square"]
    assert [b.node_id for b in graph.callbacks] == ["on_failure", "finally"]
    box = graph.boxes[1]
    assert box.lines[2] == "12/25 completed, 1 failed, …"  # whole statuses, as many as fit; the tooltip has all
    assert count_words(mapped["counts"]) == "12/25 completed, 1 failed, 3 running, 9 queued"
    assert "tasks: 12/25 completed, 1 failed, 3 running, 9 queued" in box.tooltip
    assert box.href == f"/console/workflows/{WID}/nodes/square"
    assert graph.boxes[0].href == "/console/tasks/00000000-0000-7000-8000-000000000007"


def test_a_blocked_node_says_what_it_waits_for_in_the_room_it_has() -> None:
    assert state_words(node("join", "a", "b", state="blocked", waiting_for=["a", "b"])) == "waiting for a, b"
    many = [f"extract-{i}" for i in range(6)]
    words = waiting_words(many)
    assert words == "waiting for extract-0 +5", words
    assert state_words(node("finally", kind="finally", state="blocked", waiting_for=["a", "b"])) == (
        "waiting for 2 nodes"
    )
    assert state_words(node("q", state="running", counts={"queued": 1})) == "queued"
    assert state_words(node("on_failure", kind="on_failure", state="skipped")) == "skipped: nothing failed"
    assert state_words(node("m", kind="map", state="blocked", waiting_for=["src"], task_ids=[])) == "waiting for src"


def test_a_map_without_tasks_yet_is_no_link_and_a_graph_too_large_is_not_drawn() -> None:
    pending = node("square", "extract", kind="map", state="blocked", task_ids=[])
    assert layout(WID, [node("extract"), pending]).boxes[1].href is None
    big = [node(f"n{i}") for i in range(DRAWN_MOST + 1)]
    assert layout(WID, big).drawn is False
