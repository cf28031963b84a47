"""The metric catalog: docs/metrics.md cannot drift, names follow the conventions, store errors are counted."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import pytest
import redis.exceptions

from taskmesh.errors import StoreError
from taskmesh.observability.metrics import OTHER_TASK, SERVED_QUEUES_MAX, UNSERVED_QUEUE, Metrics, current_metrics
from taskmesh.services.base import Outage
from taskmesh.store.classify import postgres_error, redis_error
from taskmesh.tasks.registry import Registry, make_handler

ROOT = Path(__file__).resolve().parents[2]


def test_docs_metrics_md_is_generated_from_the_registry() -> None:
    expected = Metrics().markdown()
    actual = (ROOT / "docs" / "metrics.md").read_text()
    assert actual == expected, "regenerate with: python -m taskmesh.observability.metrics_doc > docs/metrics.md"


def test_every_exposed_family_is_in_the_catalog_and_follows_the_naming_rules() -> None:
    m = Metrics()
    documented = {info.name for info in m.catalog}
    exposed = set()
    for family in m.registry.collect():
        if family.name.startswith("taskmesh_"):
            exposed.add(family.name + "_total" if family.type == "counter" else family.name)
    assert exposed == documented
    for info in m.catalog:
        assert re.fullmatch(r"taskmesh_[a-z_]+", info.name)
        assert info.name.endswith("_total") == (info.type == "counter")
        assert not {"task_id", "id", "payload", "run_id"} & set(info.labels)
        if info.type == "histogram":
            assert info.name.endswith("_seconds")


def test_retry_is_exposed_as_retrying_and_durations_span_a_millisecond_to_an_hour() -> None:
    m = Metrics(task_names={"t"}, queues=["default"])
    m.run_finished("default", "t", "retry", 0.0005)
    m.run_finished("default", "t", "lease_expired", None)
    text = m.render().decode()
    assert 'taskmesh_runs_finished_total{outcome="retrying",queue="default",task_name="t"} 1.0' in text
    assert 'taskmesh_runs_finished_total{outcome="lease_expired",queue="default",task_name="t"} 1.0' in text
    assert 'taskmesh_run_duration_seconds_bucket{le="0.001",queue="default",task_name="t"} 1.0' in text
    assert 'le="3600.0"' in text
    assert not re.search(r"^taskmesh_\w+_created", text, re.M)
    assert "process_resident_memory_bytes" in text
    assert re.search(r'taskmesh_build_info\{python_version="[\d.]+",version="[^"]+"\} 1\.0', text)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("error", "store"),
    [
        (redis_error("ping", redis.exceptions.ConnectionError("down")), "redis"),
        (postgres_error("ping", asyncpg.PostgresConnectionError("down")), "postgres"),
    ],
)
async def test_store_errors_are_counted_for_the_instance_of_the_running_task(error: StoreError, store: str) -> None:
    assert error.transient
    m = Metrics()
    token = current_metrics.set(m)
    try:
        outage = Outage("test", max_delay=0.001)
        await outage.failed(error)
        await outage.failed(error)
    finally:
        current_metrics.reset(token)
    assert m.registry.get_sample_value("taskmesh_store_errors_total", {"store": store}) == 2


def test_unregistered_task_names_and_unserved_queues_share_one_fixed_label_each() -> None:
    registry = Registry()
    m = Metrics(task_names=registry, queues=["default"])
    registry.add(make_handler("known", lambda payload: None))  # registered after: still a label
    for i in range(500):
        m.run_started("default", f"random-{i}", 0.1)
        m.run_finished(f"q-{i}", "known", "retry", 0.01)
        m.task_created(f"q-{i}")
    m.task_deduplicated("elsewhere")
    m.tasks_repushed_to("elsewhere", 2)
    m.set_served_queues(["served-by-another"])
    m.task_created("served-by-another")
    get = m.registry.get_sample_value
    assert get("taskmesh_runs_started_total", {"queue": "default", "task_name": "(other)"}) == 500
    assert get("taskmesh_queue_wait_seconds_count", {"queue": "default", "task_name": "(other)"}) == 500
    labels = {"queue": "(unserved)", "task_name": "known"}
    assert get("taskmesh_runs_finished_total", {**labels, "outcome": "retrying"}) == 500
    assert get("taskmesh_run_duration_seconds_count", labels) == 500
    assert get("taskmesh_tasks_created_total", {"queue": "(unserved)"}) == 500
    assert get("taskmesh_tasks_created_total", {"queue": "served-by-another"}) == 1
    assert get("taskmesh_tasks_deduplicated_total", {"queue": "(unserved)"}) == 1
    assert get("taskmesh_tasks_repushed_total", {"queue": "(unserved)"}) == 2
    text = m.render().decode()
    assert "random-" not in text and "q-1" not in text


def test_the_fallback_handler_does_not_make_a_name_a_label_and_served_queues_are_capped() -> None:
    registry = Registry()
    registry.fallback = make_handler("demo", lambda payload: None)
    m = Metrics(task_names=registry, queues=["default"])
    assert m.task_label("anything") == OTHER_TASK
    m.set_served_queues(f"q{i}" for i in range(SERVED_QUEUES_MAX + 500))
    labelled = sum(1 for i in range(SERVED_QUEUES_MAX + 500) if m.queue_label(f"q{i}") != UNSERVED_QUEUE)
    assert labelled == SERVED_QUEUES_MAX
    assert m.queue_label("default") == "default"
    m.set_served_queues([])
    assert (m.queue_label("q0"), m.queue_label("default")) == (UNSERVED_QUEUE, "default")
