"""What the alert rules and the dashboard may reference, and a small PromQL reader to check them.

``CONTRACT`` is the metric contract (names as exposed, labels, closed
label values): the alert rules and the Grafana dashboard may use these, the
``process_*`` collectors and ``up``, nothing else. ``test_metric_contract.py``
checks that the code exposes exactly these names with these labels.
"""

from __future__ import annotations

import os
import re
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CLUSTER_WIDE",
    "CONTRACT",
    "LABEL_VALUES",
    "RESERVED_LABEL_VALUES",
    "Selector",
    "contract_problems",
    "grouping_labels",
    "metric_names",
    "promtool",
    "selectors",
    "sums_cluster_wide_gauge",
]


@dataclass(frozen=True)
class Family:
    type: str
    labels: tuple[str, ...]


CONTRACT: dict[str, Family] = {
    "taskmesh_build_info": Family("gauge", ("version", "python_version")),
    "taskmesh_tasks_created_total": Family("counter", ("queue",)),
    "taskmesh_tasks_deduplicated_total": Family("counter", ("queue",)),
    "taskmesh_runs_started_total": Family("counter", ("queue", "task_name")),
    "taskmesh_runs_finished_total": Family("counter", ("queue", "task_name", "outcome")),
    "taskmesh_run_duration_seconds": Family("histogram", ("queue", "task_name")),
    "taskmesh_queue_wait_seconds": Family("histogram", ("queue", "task_name")),
    "taskmesh_queue_depth": Family("gauge", ("queue", "state")),
    "taskmesh_queue_oldest_ready_age_seconds": Family("gauge", ("queue",)),
    "taskmesh_queue_paused": Family("gauge", ("queue",)),
    "taskmesh_in_flight": Family("gauge", ("queue",)),
    "taskmesh_concurrency": Family("gauge", ("queue",)),
    "taskmesh_workers": Family("gauge", ("state",)),
    "taskmesh_heartbeats_total": Family("counter", ()),
    "taskmesh_workers_lost_total": Family("counter", ()),
    "taskmesh_runs_reclaimed_total": Family("counter", ("outcome",)),
    "taskmesh_tasks_repushed_total": Family("counter", ("queue",)),
    "taskmesh_redis_resyncs_total": Family("counter", ()),
    "taskmesh_late_results_total": Family("counter", ()),
    "taskmesh_redis_push_failures_total": Family("counter", ()),
    "taskmesh_schedule_fires_total": Family("counter", ("schedule", "outcome")),
    "taskmesh_workflows_submitted_total": Family("counter", ("workflow",)),
    "taskmesh_workflows_ended_total": Family("counter", ("workflow", "outcome")),
    "taskmesh_workflow_duration_seconds": Family("histogram", ("workflow",)),
    "taskmesh_workflow_repairs_total": Family("counter", ()),
    "taskmesh_limit_in_use": Family("gauge", ("limit",)),
    "taskmesh_limit_waiting": Family("gauge", ("limit",)),
    "taskmesh_limit_refused_total": Family("counter", ("limit",)),
    "taskmesh_http_requests_total": Family("counter", ("route", "method", "status")),
    "taskmesh_http_request_duration_seconds": Family("histogram", ("route", "method")),
    "taskmesh_store_errors_total": Family("counter", ("store",)),
    "taskmesh_store_schema_errors_total": Family("counter", ("operation",)),
    "taskmesh_clock_offset_seconds": Family("gauge", ()),
    "taskmesh_http_refused_total": Family("counter", ("reason",)),
    "taskmesh_event_loop_blocked_total": Family("counter", ()),
    "taskmesh_event_loop_lag_seconds": Family("gauge", ()),
    "taskmesh_service_restarts_total": Family("counter", ("service",)),
    "taskmesh_service_up": Family("gauge", ("service",)),
    "taskmesh_service_ticks_total": Family("counter", ("service", "outcome")),
}

STANDARD: dict[str, Family] = {
    "up": Family("gauge", ()),
    "process_cpu_seconds_total": Family("counter", ()),
    "process_resident_memory_bytes": Family("gauge", ()),
    "process_virtual_memory_bytes": Family("gauge", ()),
    "process_open_fds": Family("gauge", ()),
    "process_max_fds": Family("gauge", ()),
    "process_start_time_seconds": Family("gauge", ()),
}
"""Series every scrape has (``up``) and prometheus-client's process collector."""

TARGET_LABELS = ("job", "instance")
"""Labels Prometheus attaches to every scraped series."""

LABEL_VALUES: dict[tuple[str, str], frozenset[str]] = {
    ("taskmesh_runs_finished_total", "outcome"): frozenset(
        {"succeeded", "retrying", "failed", "cancelled", "lease_expired", "interrupted"}
    ),
    ("taskmesh_queue_depth", "state"): frozenset({"ready", "delayed", "running", "dead_letter"}),
    ("taskmesh_workers", "state"): frozenset({"running", "draining", "stopped", "lost"}),
    ("taskmesh_schedule_fires_total", "outcome"): frozenset(
        {"fired", "misfire_fired", "misfire_skipped", "overlap_skipped", "triggered", "duplicate"}
    ),
    ("taskmesh_store_errors_total", "store"): frozenset({"postgres", "redis"}),
    ("taskmesh_workflows_ended_total", "outcome"): frozenset({"completed", "failed", "cancelled"}),
    ("taskmesh_service_ticks_total", "outcome"): frozenset({"ok", "store_unavailable", "error"}),
    ("taskmesh_http_refused_total", "reason"): frozenset({"headers_too_large", "read_timeout", "too_many_connections"}),
}
"""Closed label values: an equality or alternation matcher on these must name only these."""

RESERVED_LABEL_VALUES: dict[str, str] = {"queue": "(unserved)", "task_name": "(other)"}
"""The one value every queue, and every task name, outside the bounded set is counted under
``queue`` and ``task_name`` are open labels, but only registered task
names and served queues get a value of their own; no name can take these (names match
``[A-Za-z0-9_.:-]``). A rule or panel may match them; ``taskmesh_queue_depth`` has
``queue="(unserved)"`` only with ``state="ready"``."""

CLUSTER_WIDE = (
    "taskmesh_queue_depth",
    "taskmesh_queue_oldest_ready_age_seconds",
    "taskmesh_queue_paused",
    "taskmesh_workers",
    "taskmesh_limit_in_use",
    "taskmesh_limit_waiting",
)
"""Gauges every instance samples from the stores: aggregate with ``max``, never ``sum``."""


def series_families() -> dict[str, tuple[str, Family]]:
    """Every series name that may appear in an expression -> (family name, family)."""
    names: dict[str, tuple[str, Family]] = {}
    for name, family in {**CONTRACT, **STANDARD}.items():
        if family.type == "histogram":
            names[f"{name}_bucket"] = (name, Family(family.type, (*family.labels, "le")))
            names[f"{name}_sum"] = (name, family)
            names[f"{name}_count"] = (name, family)
        else:
            names[name] = (name, family)
    return names


_FUNCTIONS = frozenset(
    """abs absent absent_over_time avg avg_over_time bottomk ceil changes clamp clamp_max clamp_min count
    count_over_time count_values day_of_month day_of_week days_in_month delta deriv exp floor group
    histogram_quantile holt_winters hour idelta increase irate label_join label_replace last_over_time ln
    log10 log2 max max_over_time min min_over_time minute month predict_linear present_over_time quantile
    quantile_over_time rate resets round scalar sgn sort sort_desc sqrt stddev stddev_over_time stdvar
    stdvar_over_time sum sum_over_time time timestamp topk vector year""".split()
)
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_SELECTOR = re.compile(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)\s*\{([^{}]*)\}")
_MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_WORD = re.compile(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)(\s*\()?")


def _grafana_free(expr: str) -> str:
    """The expression with Grafana's interval variables replaced by durations."""
    return re.sub(r"\$\{?__(rate_interval|interval|range)\}?", "5m", expr)


def metric_names(expr: str) -> set[str]:
    """The series names an expression selects.

    :raises ValueError: a word followed by ``(`` that is not a PromQL function.
    """
    text = _grafana_free(expr)
    text = _STRING.sub('""', text)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    names: set[str] = set()
    for match in _WORD.finditer(text):
        word, call = match.group(1), match.group(2)
        if word in _KEYWORDS:
            continue
        if call:
            if word not in _FUNCTIONS:
                raise ValueError(f"{word}( is not a PromQL function in {expr!r}")
        else:
            names.add(word)
    return names


@dataclass(frozen=True)
class Selector:
    """``name{label op "value", ...}``: the matchers as (label, op, value)."""

    name: str
    matchers: tuple[tuple[str, str, str], ...]

    def matcher(self, label: str) -> tuple[str, str] | None:
        for name, op, value in self.matchers:
            if name == label:
                return op, value
        return None


def selectors(expr: str) -> list[Selector]:
    """Every selector of an expression; a bare metric name is a selector without matchers.

    :raises ValueError: a matcher list this reader cannot take apart.
    """
    text = _grafana_free(expr)
    found: list[Selector] = []
    for match in _SELECTOR.finditer(text):
        body = match.group(2)
        matchers = tuple((m.group(1), m.group(2), m.group(3)) for m in _MATCHER.finditer(body))
        if "".join(m.group(0) for m in _MATCHER.finditer(body)).strip() != body.strip():
            raise ValueError(f"cannot read the matchers {body!r} in {expr!r}")
        found.append(Selector(match.group(1), matchers))
    braced = {s.name for s in found}
    found.extend(Selector(name, ()) for name in metric_names(expr) - braced)
    return found


def grouping_labels(expr: str) -> set[str]:
    """Labels named in ``by (...)``, ``without (...)``, ``on (...)``, ``ignoring (...)`` and group modifiers."""
    text = _STRING.sub('""', _grafana_free(expr))
    labels: set[str] = set()
    for match in _GROUPING.finditer(text):
        labels.update(part.strip() for part in match.group(2).split(",") if part.strip())
    return labels


def contract_problems(expr: str) -> list[str]:
    """What an expression uses outside the contract: metric names, label names, closed label values, grouping."""
    families = series_families()
    problems: list[str] = []
    used: set[str] = set()
    for selector in selectors(expr):
        if selector.name not in families:
            problems.append(f"unknown metric {selector.name}")
            continue
        family_name, family = families[selector.name]
        used.update(family.labels)
        for label, op, value in selector.matchers:
            if label not in (*family.labels, *TARGET_LABELS):
                problems.append(f"{selector.name} has no label {label}")
            closed = LABEL_VALUES.get((family_name, label))
            if closed is not None and op in ("=", "=~") and not set(value.split("|")) <= closed:
                problems.append(f"{selector.name}: {label} is never {value!r}")
    stray = grouping_labels(expr) - used - {"le", *TARGET_LABELS}
    if stray:
        problems.append(f"grouping by labels no selected metric has: {sorted(stray)}")
    return problems


_SUMMED_CLUSTER_WIDE = re.compile(r"\bsum\b(\s*(by|without)\s*\([^()]*\))?\s*\(\s*(" + "|".join(CLUSTER_WIDE) + r")\b")


def sums_cluster_wide_gauge(expr: str) -> bool:
    """Whether ``sum`` is applied directly to a cluster-wide gauge (it counts it once per instance)."""
    return _SUMMED_CLUSTER_WIDE.search(expr) is not None


def promtool() -> str | None:
    """The promtool to run: ``$PROMTOOL``, else on PATH, else the one `make deploy-tools` unpacked into the venv."""
    explicit = os.environ.get("PROMTOOL")
    if explicit:
        return explicit
    found = shutil.which("promtool")
    if found:
        return found
    venv = Path(sysconfig.get_path("scripts")) / "promtool"
    return str(venv) if os.access(venv, os.X_OK) else None
