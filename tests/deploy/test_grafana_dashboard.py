"""deploy/grafana/taskmesh.json: an importable dashboard whose every query uses only the metric contract.

No Grafana runs here: the JSON model is checked for what an import needs (fixed
uid, no numeric id, a datasource variable used by every panel, panels on the
24-column grid without overlaps), every PromQL expression is read for metric
names, labels and label values, and promtool parses every expression.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.deploy import promql
from tests.tools import tool_missing

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "taskmesh.json"
DS = {"type": "prometheus", "uid": "${datasource}"}


def load() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert match, f"variable {variable['name']}: {query}"
            yield f"variable {variable['name']}", match.group(1)


def test_dashboard_has_a_fixed_uid_and_imports_into_any_grafana() -> None:
    dashboard = load()
    assert dashboard["uid"] == "taskmesh-overview"
    assert dashboard["id"] is None  # an id from another Grafana would clash on import
    assert dashboard["title"] == "taskmesh"
    assert isinstance(dashboard["schemaVersion"], int)
    assert "taskmesh" in dashboard["tags"]


def test_dashboard_has_datasource_job_instance_and_queue_variables() -> None:
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance", "queue"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == DS
    for name in ("instance", "queue"):
        assert variables[name]["multi"] and variables[name]["includeAll"]
        assert variables[name]["allValue"] == ".*"  # queues that appear later are included
    assert variables["job"]["current"]["value"] == "taskmesh"


def test_every_panel_queries_the_datasource_variable() -> None:
    for panel in panels(load()):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DS, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DS, panel["title"]


def test_panels_have_unique_ids_and_fit_the_grid_without_overlapping() -> None:
    seen_ids: set[int] = set()
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(load()):
        assert panel["id"] not in seen_ids, panel["title"]
        seen_ids.add(panel["id"])
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_every_expression_uses_only_contract_metrics_labels_and_values() -> None:
    for where, expr in expressions(load()):
        assert promql.contract_problems(expr) == [], where


def test_every_selector_follows_the_job_instance_and_queue_variables() -> None:
    families = promql.series_families()
    for where, expr in expressions(load()):
        if where.startswith("variable"):
            continue
        for selector in promql.selectors(expr):
            assert selector.matcher("job") == ("=~", "$job"), f"{where}: {selector.name}"
            assert selector.matcher("instance") == ("=~", "$instance"), f"{where}: {selector.name}"
            if "queue" in families[selector.name][1].labels:
                assert selector.matcher("queue") == ("=~", "$queue"), f"{where}: {selector.name}"


def test_cluster_wide_gauges_are_combined_with_max_not_sum() -> None:
    for where, expr in expressions(load()):
        assert not promql.sums_cluster_wide_gauge(expr), where


def test_dashboard_charts_throughput_failures_latency_depths_workers_schedules_http_and_process() -> None:
    exprs = [expr for _, expr in expressions(load())]
    used: set[str] = set().union(*(promql.metric_names(expr) for expr in exprs))
    wanted = {
        "taskmesh_tasks_created_total",
        "taskmesh_runs_finished_total",
        "taskmesh_run_duration_seconds_bucket",
        "taskmesh_queue_wait_seconds_bucket",
        "taskmesh_queue_depth",
        "taskmesh_queue_oldest_ready_age_seconds",
        "taskmesh_workers",
        "taskmesh_in_flight",
        "taskmesh_concurrency",
        "taskmesh_schedule_fires_total",
        "taskmesh_http_requests_total",
        "taskmesh_http_request_duration_seconds_bucket",
        "taskmesh_store_errors_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    }
    assert wanted - used == set()
    for histogram in ("taskmesh_run_duration_seconds", "taskmesh_queue_wait_seconds"):
        for quantile in ("0.5", "0.95", "0.99"):
            assert any(
                re.search(rf"histogram_quantile\({quantile}, sum by \(le\) \(rate\({histogram}_bucket", expr)
                for expr in exprs
            ), (histogram, quantile)


def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    tool = promql.promtool() or tool_missing(
        "promtool", "Debian package prometheus", "the dashboard's PromQL was not parsed"
    )
    rules = [
        {"record": f"taskmesh:dashboard:expr{i}", "expr": re.sub(r"\$__\w+", "5m", expr)}
        for i, (_, expr) in enumerate(expressions(load()))
    ]
    rule_file = tmp_path / "dashboard.rules.yml"
    rule_file.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # JSON is YAML
    done = subprocess.run([tool, "check", "rules", str(rule_file)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
