"""The metrics the alert rules and the dashboard rely on are the ones the code exposes, with those labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from taskmesh.observability.metrics import Metrics
from tests.deploy import promql


def test_the_registry_exposes_exactly_the_metric_contract() -> None:
    catalog = {info.name: promql.Family(info.type, tuple(info.labels)) for info in Metrics().catalog}
    assert catalog == promql.CONTRACT


def test_the_process_collectors_the_dashboard_charts_are_exposed() -> None:
    exposed: set[str] = set()
    for family in text_string_to_metric_families(Metrics().render().decode()):
        exposed.update(sample.name for sample in family.samples)
    charted = {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"}
    charted.add("process_start_time_seconds")
    assert charted <= exposed


def test_the_worker_states_the_alerts_name_are_the_ones_the_sampler_sets() -> None:
    from taskmesh.tasks.states import WorkerState

    assert {s.value for s in WorkerState} == promql.LABEL_VALUES[("taskmesh_workers", "state")]


def test_unregistered_names_and_unserved_queues_are_counted_under_the_reserved_values() -> None:
    import re

    from taskmesh.observability.metrics import OTHER_TASK, UNSERVED_QUEUE
    from taskmesh.tasks.validation import NAME_REGEX

    assert promql.RESERVED_LABEL_VALUES == {"queue": UNSERVED_QUEUE, "task_name": OTHER_TASK}
    assert not any(re.fullmatch(NAME_REGEX, v) for v in promql.RESERVED_LABEL_VALUES.values())
    families = {info.name: info.labels for info in Metrics().catalog}
    bounded = {name for name, labels in families.items() if {"queue", "task_name"} & set(labels)}
    m = Metrics(task_names={"known"}, queues=["default"])
    m.task_created("nope")
    m.task_deduplicated("nope")
    m.tasks_repushed_to("nope", 1)
    m.run_started("nope", "nope", 0.1)
    m.run_finished("nope", "nope", "failed", 0.1)
    m.prepare(["default"], {"default": 1})
    exposed: dict[str, set[tuple[str, str]]] = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for sample in family.samples:
            for label in ("queue", "task_name"):
                if label in sample.labels:
                    exposed.setdefault(label, set()).add((family.name, sample.labels[label]))
    assert {v for _, v in exposed["queue"]} == {"default", "(unserved)"}
    assert {v for _, v in exposed["task_name"]} == {"(other)"}
    assert bounded == {
        "taskmesh_tasks_created_total",
        "taskmesh_tasks_deduplicated_total",
        "taskmesh_runs_started_total",
        "taskmesh_runs_finished_total",
        "taskmesh_run_duration_seconds",
        "taskmesh_queue_wait_seconds",
        "taskmesh_queue_depth",
        "taskmesh_queue_oldest_ready_age_seconds",
        "taskmesh_queue_paused",
        "taskmesh_in_flight",
        "taskmesh_concurrency",
        "taskmesh_tasks_repushed_total",
    }, "a new family with a queue or task_name label: write it through Metrics.queue_label/task_label"
