"""deploy/prometheus/alerts.yml: promtool checks it and runs its unit tests; every alert is complete and tested.

promtool comes from Debian's prometheus package (`make deploy-tools` unpacks it
into /usr/local/bin as root, else into the venv); without it those two tests
skip and say so.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy import promql
from tests.tools import tool_missing

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yml"


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = promql.promtool() or tool_missing(
        "promtool", "Debian package prometheus", "the alert rules were not checked"
    )
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules_accepts_the_alert_rules() -> None:
    done = run_promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES.relative_to(ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_of_the_alert_rules_pass() -> None:
    done = run_promtool("test", "rules", str(RULE_TESTS.relative_to(ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_named_labelled_and_annotated_as_operators_expect() -> None:
    rules = alert_rules()
    assert rules
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Taskmesh[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"].strip(), name
        assert rule["annotations"]["description"].strip(), name


def test_every_alert_has_a_unit_test_where_it_fires_and_one_where_it_stays_silent() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fires == set(), "alerts no unit test fires"
    assert names - silent == set(), "alerts no unit test keeps silent"
    assert (fires | silent) - names == set(), "unit tests of alerts that do not exist"


def test_alert_expressions_use_only_the_metric_contract() -> None:
    for rule in alert_rules():
        assert promql.contract_problems(rule["expr"]) == [], rule["alert"]
        for selector in promql.selectors(rule["expr"]):
            if selector.name != "up":
                assert selector.matcher("job") == ("=", "taskmesh"), f"{rule['alert']}: {selector.name} without job"


def test_cluster_wide_gauges_are_combined_with_max_not_sum() -> None:
    for rule in alert_rules():
        assert not promql.sums_cluster_wide_gauge(rule["expr"]), rule["alert"]
