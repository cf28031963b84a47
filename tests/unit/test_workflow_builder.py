"""The clients' workflow builder: the body it makes, and what it refuses before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest

from taskmesh.clients.workflows import WorkflowBuilder
from taskmesh.errors import InvalidTaskError
from taskmesh.workflows.spec import parse_workflow


def builder(name: str = "nightly-report", **options: Any) -> WorkflowBuilder[dict[str, Any]]:
    """A builder whose submit answers the body it was handed, as a client's would send it."""
    return WorkflowBuilder(name, lambda body: {"sent": body}, **options)


def refusal(call: Any) -> tuple[str, str]:
    with pytest.raises(InvalidTaskError) as info:
        call()
    assert str(info.value) == f"{info.value.field}: {info.value.message}"
    return info.value.field, info.value.message


def test_a_chained_workflow_is_the_post_body_of_the_contract_with_every_option_given() -> None:
    wf = (
        builder(
            dedup_key="2026-12-01", tenant_id="acme", queue_name="reports", context={"day": "2026-12-01"}, trace_id="t1"
        )
        .task("extract", "reports.extract", {"day": "2026-12-01"}, priority=5, timeout=30.0)
        .map("render", "reports.render", from_="extract", max_retries=1, queue_name="gpu")
        .map("notify", "mail.send", ["a@x", "b@x"], on_dep_failure="ignore")
        .task("publish", "reports.publish", deps=["render", "notify"], on_dep_failure="continue")
        .on_failure("alerts.page", {"team": "data"}, queue_name="alerts", priority=900)
        .finally_("reports.cleanup", max_retries=0, timeout=5.0)
    )
    assert wf.to_json() == {
        "name": "nightly-report",
        "dedup_key": "2026-12-01",
        "tenant_id": "acme",
        "queue_name": "reports",
        "context": {"day": "2026-12-01"},
        "trace_id": "t1",
        "nodes": [
            {
                "id": "extract",
                "task": "reports.extract",
                "payload": {"day": "2026-12-01"},
                "priority": 5,
                "timeout": 30.0,
            },
            {
                "id": "render",
                "task": "reports.render",
                "deps": ["extract"],
                "queue_name": "gpu",
                "max_retries": 1,
                "map": {"from": "extract"},
            },
            {"id": "notify", "task": "mail.send", "on_dep_failure": "ignore", "map": ["a@x", "b@x"]},
            {"id": "publish", "task": "reports.publish", "deps": ["render", "notify"], "on_dep_failure": "continue"},
        ],
        "on_failure": {"task": "alerts.page", "payload": {"team": "data"}, "queue_name": "alerts", "priority": 900},
        "finally": {"task": "reports.cleanup", "max_retries": 0, "timeout": 5.0},
    }


def test_unset_options_and_fields_are_left_out_but_falsy_values_given_are_kept() -> None:
    body = builder(context=[]).task("a", "t.a").task("b", "t.b", 0, priority=0, max_retries=0, deps=[]).to_json()
    assert body == {
        "name": "nightly-report",
        "context": [],
        "nodes": [
            {"id": "a", "task": "t.a"},
            {"id": "b", "task": "t.b", "payload": 0, "priority": 0, "max_retries": 0},
        ],
    }


def test_deps_may_name_nodes_added_later_and_a_single_name_is_one_dep() -> None:
    body = builder().task("report", "t.report", deps="extract").map("extract", "t.extract", ("x", 1)).to_json()
    assert body["nodes"] == [
        {"id": "report", "task": "t.report", "deps": ["extract"]},
        {"id": "extract", "task": "t.extract", "map": ["x", 1]},
    ]


def test_submit_hands_the_body_to_the_client_and_returns_its_answer() -> None:
    wf = builder().task("a", "t.a", {"n": 1})
    assert wf.submit() == {"sent": wf.to_json()}


def test_each_body_has_containers_of_its_own() -> None:
    items = ["x"]
    wf = builder().task("a", "t.a").map("m", "t.m", items, deps=["a"])
    first = wf.to_json()
    first["nodes"][1]["deps"].append("zzz")
    first["nodes"][1]["map"].append("y")
    items.append("late")
    assert wf.to_json()["nodes"][1] == {"id": "m", "task": "t.m", "deps": ["a"], "map": ["x"]}


def test_a_map_over_a_nodes_result_waits_for_that_node_whether_or_not_deps_name_it() -> None:
    wf = (
        builder()
        .task("a", "t.a")
        .task("b", "t.b")
        .map("m", "t.m", from_="b", deps=["a"])
        .map("n", "t.n", from_="b", deps=["b", "a"])
    )
    assert [n.get("deps") for n in wf.to_json()["nodes"]] == [None, None, ["a", "b"], ["b", "a"]]


def test_a_node_id_given_twice_or_reserved_is_refused_at_once_in_the_servers_words() -> None:
    wf = builder().task("a", "t.a")
    assert refusal(lambda: wf.task("a", "t.b")) == ("nodes[1].id", "duplicate node id 'a' (also nodes[0])")
    assert refusal(lambda: wf.map("a", "t.b", [1])) == ("nodes[1].id", "duplicate node id 'a' (also nodes[0])")
    for reserved in ("on_failure", "finally"):
        assert refusal(lambda r=reserved: wf.task(r, "t.b")) == (
            "nodes[1].id",
            f"{reserved!r} is the id of the workflow's {reserved} callback",
        )
    assert [n["id"] for n in wf.to_json()["nodes"]] == ["a"]


def test_a_dep_or_a_map_source_naming_no_node_is_refused_when_the_body_is_made() -> None:
    wf = builder().task("a", "t.a").task("b", "t.b", deps=["a", "x"])
    assert refusal(wf.to_json) == ("nodes[1].deps", "node 'b' depends on 'x', which is no node")
    assert refusal(wf.submit) == ("nodes[1].deps", "node 'b' depends on 'x', which is no node")
    mapped = builder().task("a", "t.a").map("m", "t.m", from_="nope")
    assert refusal(mapped.to_json) == ("nodes[1].map.from", "node 'm' maps over 'nope', which is no node")


def test_bad_map_arguments_and_on_dep_failure_values_are_refused() -> None:
    wf = builder().task("a", "t.a")
    assert refusal(lambda: wf.map("m", "t.m")) == ("nodes[1].map", "give items or from_, one of them")
    assert refusal(lambda: wf.map("m", "t.m", [1], from_="a")) == ("nodes[1].map", "give items or from_, one of them")
    assert refusal(lambda: wf.map("m", "t.m", "abc")) == ("nodes[1].map", "items must be a list or a tuple, not str")
    assert refusal(lambda: wf.task("b", "t.b", on_dep_failure="skip")) == (
        "nodes[1].on_dep_failure",
        "Input should be 'fail', 'ignore' or 'continue'",
    )


def test_a_callback_given_twice_is_refused() -> None:
    wf = builder().task("a", "t.a").on_failure("t.alert").finally_("t.clean")
    assert refusal(lambda: wf.on_failure("t.other")) == ("on_failure", "given twice: a workflow has one")
    assert refusal(lambda: wf.finally_("t.other")) == ("finally", "given twice: a workflow has one")
    assert (wf.to_json()["on_failure"], wf.to_json()["finally"]) == ({"task": "t.alert"}, {"task": "t.clean"})


def test_the_refusals_are_the_clients_bad_input_error() -> None:
    with pytest.raises(ValueError, match="duplicate node id"):
        builder().task("a", "t.a").task("a", "t.a")


def test_the_server_takes_the_builders_body_and_refuses_the_same_graphs_in_the_same_words() -> None:
    wf = (
        builder(dedup_key="d", context={"a": 1}, trace_id="t")
        .task("extract", "reports.extract", {"day": 1}, timeout=30.0)
        .map("render", "reports.render", from_="extract", on_dep_failure="continue")
        .map("notify", "mail.send", ["a@x"])
        .task("publish", "reports.publish", deps=["render", "notify"])
        .on_failure("alerts.page", priority=900)
        .finally_("reports.cleanup", {"x": 1})
    )
    spec = parse_workflow(wf.to_json())
    assert [(n.id, n.deps) for n in spec.nodes] == [
        ("extract", []),
        ("render", ["extract"]),
        ("notify", []),
        ("publish", ["render", "notify"]),
    ]
    raw = {"name": "w", "nodes": [{"id": "a", "task": "t.a"}, {"id": "a", "task": "t.a"}]}
    local = refusal(lambda: builder("w").task("a", "t.a").task("a", "t.a"))
    assert refusal(lambda: parse_workflow(raw)) == local
    raw = {"name": "w", "nodes": [{"id": "a", "task": "t.a"}, {"id": "b", "task": "t.b", "deps": ["a", "x"]}]}
    assert refusal(lambda: parse_workflow(raw)) == refusal(
        builder("w").task("a", "t.a").task("b", "t.b", deps=["a", "x"]).to_json
    )
    for reserved in ("on_failure", "finally"):
        raw = {"name": "w", "nodes": [{"id": "a", "task": "t.a"}, {"id": reserved, "task": "t.a"}]}
        assert refusal(lambda r=raw: parse_workflow(r)) == refusal(
            lambda r=reserved: builder("w").task("a", "t.a").task(r, "t.a")
        )
    raw = {"name": "w", "nodes": [{"id": "a", "task": "t.a", "on_dep_failure": "skip"}]}
    assert refusal(lambda: parse_workflow(raw)) == refusal(lambda: builder("w").task("a", "t.a", on_dep_failure="skip"))
