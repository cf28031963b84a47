"""The metrics the alert rules and the dashboard rely on are the ones the code exposes, with those labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from taskmesh.metrics import Metrics
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
    from taskmesh.states import WorkerState

    assert {s.value for s in WorkerState} == promql.LABEL_VALUES[("taskmesh_workers", "state")]
