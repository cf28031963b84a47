"""Prometheus metrics of one instance (``taskmesh_`` prefix, base units, bounded labels).

Labels are queue, task name, outcome, state, schedule, store, a store operation
(a named statement: a fixed set), and the HTTP route template: never a task id or
a payload value. Each instance (and each test) owns its own :class:`Metrics` with
its own registry; every family is listed in :attr:`Metrics.catalog`, from which ``docs/metrics.md`` is generated
(``python -m taskmesh.observability.metrics_doc > docs/metrics.md``; a test keeps them equal).

Task names and queues come from clients, so they are bounded (
1,000 random names once grew ``/metrics`` from 144 series to 48,178): a task name
is a label only when a handler is registered under it, else it counts as
``(other)`` (also when the dev profile's fallback handler runs it); a queue only
when this instance is configured with it or a live worker serves it (the sampler
refreshes those from the ``workers`` table, at most 1,000), else ``(unserved)``.
Neither value can be a name (names match ``[A-Za-z0-9_.:-]``). Every family with
a ``queue`` or ``task_name`` label is written through :meth:`Metrics.queue_label`
and :meth:`Metrics.task_label`.

Gauges marked *cluster-wide* (queue depths, oldest ready age, workers) are
read from Redis and PostgreSQL by every instance's sampler every
``metrics_sample_seconds``, not at scrape time: aggregate them across
instances with ``max by (queue)``, not ``sum``.
"""

from __future__ import annotations

import platform
from collections.abc import Container, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from taskmesh import __version__

# The ``_created`` series of every counter double the series count for nothing an
# alert or a dashboard reads.
disable_created_metrics()  # type: ignore[no-untyped-call]

DURATION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
)
"""Run duration and queue wait buckets: 1 ms to 1 h, seconds."""
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""HTTP request latency buckets, seconds."""
WORKFLOW_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
"""Workflow duration buckets, seconds (a tenth of a second to a day)."""

HTTP_REFUSAL_REASONS = (
    "headers_too_large",
    "read_timeout",
    "too_many_connections",
    "too_many_connections_from_address",
)
"""Values of the ``reason`` label of ``taskmesh_http_refused_total`` (see ``taskmesh.api.server``)."""

OUTCOME_LABELS = {"retry": "retrying"}
"""Executor outcomes under their metric names (the rest keep their value)."""

OTHER_TASK = "(other)"
"""The ``task_name`` label of every task name no handler is registered under."""
WORKFLOW_NAMES_MAX = 100
"""Distinct ``workflow`` label values one instance makes; later names count under ``(other)``."""
UNSERVED_QUEUE = "(unserved)"
"""The ``queue`` label of every queue this instance is not configured with and no live worker serves."""
SERVED_QUEUES_MAX = 1000
"""Most queues served by other instances that get a label of their own (the rest are ``(unserved)``)."""

__all__ = [
    "DURATION_BUCKETS",
    "HTTP_REFUSAL_REASONS",
    "OTHER_TASK",
    "SERVED_QUEUES_MAX",
    "UNSERVED_QUEUE",
    "MetricInfo",
    "Metrics",
    "current_metrics",
]


@dataclass(frozen=True)
class MetricInfo:
    """One metric family as documented: exposed name, type, labels, meaning."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


current_metrics: ContextVar[Metrics | None] = ContextVar("taskmesh_metrics", default=None)
"""The running instance's metrics, for code that has no handle on it (store error counts).
Set by the supervisor in its own task, so instances sharing a process stay apart."""


class Metrics:
    """The instance's metric families (see ``docs/metrics.md`` for the list).

    :param task_names: the task names that are labels of their own (the registry: it is
        asked on each use, so handlers registered later count); any other is ``(other)``.
    :param queues: the queues this instance is configured with (``queue_names``), labels of
        their own; so are those :meth:`set_served_queues` names. Any other is ``(unserved)``.
    """

    def __init__(self, *, task_names: Container[str] = frozenset(), queues: Iterable[str] = ()) -> None:
        self._task_names = task_names
        self._own_queues = frozenset(queues)
        self._queues = self._own_queues
        self.registry = CollectorRegistry()
        self.catalog: list[MetricInfo] = []
        c, g, h = self._counter, self._gauge, self._histogram
        self.build_info = g(
            "taskmesh_build_info", "Constant 1, labelled with the version.", "version", "python_version"
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        # Tasks and runs.
        self.tasks_created = c("taskmesh_tasks_created", "Tasks created (not deduplicated).", "queue")
        self.tasks_deduplicated = c(
            "taskmesh_tasks_deduplicated", "Enqueues answered by an existing task (idempotency key).", "queue"
        )
        self.runs_started = c("taskmesh_runs_started", "Runs whose handler started.", "queue", "task_name")
        self.runs_finished = c(
            "taskmesh_runs_finished",
            "Runs finished, by outcome: succeeded, retrying, failed (dead-lettered), cancelled, "
            "lease_expired (ended by the reclaimer), interrupted (handed back at shutdown).",
            "queue",
            "task_name",
            "outcome",
        )
        self.run_duration = h(
            "taskmesh_run_duration_seconds", "Handler wall time of a run.", DURATION_BUCKETS, "queue", "task_name"
        )
        self.queue_wait = h(
            "taskmesh_queue_wait_seconds",
            "Time from a task becoming runnable (created, or due) to its handler starting.",
            DURATION_BUCKETS,
            "queue",
            "task_name",
        )
        # Queues (cluster-wide, sampled).
        self.queue_depth = g(
            "taskmesh_queue_depth",
            "Tasks by state: ready and delayed (Redis), running and dead_letter (PostgreSQL); cluster-wide, sampled. "
            'queue="(unserved)", state="ready": due queued tasks of every queue no live worker serves.',
            "queue",
            "state",
        )
        self.queue_oldest_ready_age = g(
            "taskmesh_queue_oldest_ready_age_seconds",
            "Age of the oldest runnable queued task (0 when none); cluster-wide, sampled.",
            "queue",
        )
        self.queue_paused = g(
            "taskmesh_queue_paused",
            "1 while the queue is paused (no instance claims its tasks), else 0; cluster-wide, sampled.",
            "queue",
        )
        # This instance.
        self.in_flight = g("taskmesh_in_flight", "Runs this instance is executing now.", "queue")
        self.concurrency = g("taskmesh_concurrency", "Executors this instance runs.", "queue")
        self.heartbeats = c("taskmesh_heartbeats", "Heartbeats this instance wrote.")
        self.event_loop_blocked = c(
            "taskmesh_event_loop_blocked",
            "Times this instance's event loop went without a tick for more than "
            "loop_block_threshold_seconds (once per blocking episode).",
        )
        self.event_loop_lag = g(
            "taskmesh_event_loop_lag_seconds",
            "How late the loop monitor's last tick ran (it ticks every 0.1 s); after a block, its length.",
        )
        # Workers (cluster-wide, sampled).
        self.workers = g(
            "taskmesh_workers",
            "Worker rows by state: running, draining, stopped, lost; cluster-wide, sampled.",
            "state",
        )
        self.workers_lost = c("taskmesh_workers_lost", "Workers this instance marked lost (silent for three leases).")
        # Recovery.
        self.runs_reclaimed = c(
            "taskmesh_runs_reclaimed",
            "Runs ended by the reclaimer after their lease expired, by the task's next status.",
            "outcome",
        )
        self.tasks_repushed = c("taskmesh_tasks_repushed", "Queued tasks pushed again into Redis.", "queue")
        self.redis_resyncs = c("taskmesh_redis_resyncs", "Full resyncs of Redis from PostgreSQL after data loss.")
        self.late_results = c(
            "taskmesh_late_results", "Run results dropped because the run had lost its lease (fencing)."
        )
        self.redis_push_failures = c(
            "taskmesh_redis_push_failures", "Pushes to Redis that failed after the commit (re-pushed later)."
        )
        self.store_errors = c("taskmesh_store_errors", "Failed calls to a store, by store: postgres, redis.", "store")
        self.store_schema_errors = c(
            "taskmesh_store_schema_errors",
            "Statements PostgreSQL refused against its schema (SQLSTATE class 42: an undefined column, table "
            "or function, ...), by operation (the named statement): this instance's release and the database's "
            "schema disagree; run taskmesh migrate or replace the instance. /readyz is 503 meanwhile.",
            "operation",
        )
        self.clock_offset = g(
            "taskmesh_clock_offset_seconds",
            "PostgreSQL's clock minus this host's, as last measured; due times and fires use PostgreSQL's.",
        )
        # Services.
        self.service_restarts = c(
            "taskmesh_service_restarts",
            "Times a service of this instance crashed with an unexpected error and was restarted.",
            "service",
        )
        self.service_up = g(
            "taskmesh_service_up",
            "1 while a service of this instance runs, 0 while it waits to restart or has failed for good.",
            "service",
        )
        self.service_ticks = c(
            "taskmesh_service_ticks",
            "Ticks of the periodic services, by outcome: ok, store_unavailable (a transient store error), "
            "error (a store error retrying cannot fix; the tick was skipped).",
            "service",
            "outcome",
        )
        # Workflows.
        self.workflows_submitted = c(
            "taskmesh_workflows_submitted", "Workflows this instance stored (a repeated dedup_key is not).", "workflow"
        )
        self.workflows_ended = c(
            "taskmesh_workflows_ended",
            "Workflows that ended, by outcome: completed, failed, cancelled (each counted by one instance: "
            "sum over instances).",
            "workflow",
            "outcome",
        )
        self.workflow_duration = h(
            "taskmesh_workflow_duration_seconds",
            "Time from a workflow's submission to its end (each counted by one instance).",
            WORKFLOW_BUCKETS,
            "workflow",
        )
        self.workflow_repairs = c(
            "taskmesh_workflow_repairs",
            "Workflow nodes the reconciler decided because no transaction had (a release lost to a bug, "
            "a workflow over but not marked so); 0 in a healthy cluster.",
        )
        # Schedules.
        self.schedule_fires = c(
            "taskmesh_schedule_fires",
            "Fire times of cron schedules, by outcome: fired, misfire_fired, misfire_skipped, "
            "overlap_skipped, triggered, duplicate.",
            "schedule",
            "outcome",
        )
        # HTTP.
        self.http_requests = c(
            "taskmesh_http_requests",
            "HTTP requests by route template, method and status.",
            "route",
            "method",
            "status",
        )
        self.http_duration = h(
            "taskmesh_http_request_duration_seconds",
            "HTTP request latency by route template and method.",
            HTTP_BUCKETS,
            "route",
            "method",
        )
        self.http_refused = c(
            "taskmesh_http_refused",
            "HTTP connections refused or cut by the server's limits, by reason: headers_too_large (431), "
            "read_timeout (request not received in time, 408 when nothing was answered yet), "
            "too_many_connections (closed at accept, over http_max_connections), "
            "too_many_connections_from_address (closed at accept, over http_max_connections_per_address).",
            "reason",
        )
        # Task limits (limits/): labelled by a configured limit's name, never by a key's value.
        self.limit_in_use = g(
            "taskmesh_limit_in_use",
            "Runs holding a limit's slots, over its keys and this instance's queues, by limit; sampled from Redis, "
            "so every instance serving the queues reports it: aggregate with max, not sum.",
            "limit",
        )
        self.limit_waiting = g(
            "taskmesh_limit_waiting",
            "Tasks parked until a limit's key has room, over its keys and this instance's queues, by limit; sampled "
            "from Redis, so every instance serving the queues reports it: aggregate with max, not sum.",
            "limit",
        )
        self.limit_refused = c(
            "taskmesh_limit_refused",
            "Popped task ids a limit did not let start (parked until its key has room), by limit.",
            "limit",
        )
        for reason in HTTP_REFUSAL_REASONS:  # at 0 from the start, so rate() and alerts see them
            self.http_refused.labels(reason)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        # Keyed by label values (bounded), never by raw names.
        self._finished: dict[tuple[str, str, str], Counter] = {}
        self._workflow_names: set[str] = set()
        self._durations: dict[tuple[str, str], Histogram] = {}
        self._started: dict[tuple[str, str], Counter] = {}
        self._waits: dict[tuple[str, str], Histogram] = {}

    # -- construction, with the catalog ---------------------------------------

    def _counter(self, name: str, doc: str, *labels: str) -> Counter:
        self.catalog.append(MetricInfo(f"{name}_total", "counter", labels, doc))
        return Counter(name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, *labels: str) -> Gauge:
        self.catalog.append(MetricInfo(name, "gauge", labels, doc))
        return Gauge(name, doc, labels, registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: Sequence[float], *labels: str) -> Histogram:
        self.catalog.append(MetricInfo(name, "histogram", labels, doc))
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    # -- bounded labels ------------------------------------------------------------

    def task_label(self, name: str) -> str:
        """``name`` when a handler is registered under it, else ``(other)``."""
        return name if name in self._task_names else OTHER_TASK

    def workflow_label(self, name: str) -> str:
        """``name`` among the first :data:`WORKFLOW_NAMES_MAX` workflow names this instance saw, else ``(other)``."""
        if name in self._workflow_names:
            return name
        if len(self._workflow_names) < WORKFLOW_NAMES_MAX:
            self._workflow_names.add(name)
            return name
        return OTHER_TASK

    def queue_label(self, queue: str) -> str:
        """``queue`` when this instance is configured with it or a live worker serves it, else ``(unserved)``."""
        return queue if queue in self._queues else UNSERVED_QUEUE

    def set_served_queues(self, queues: Iterable[str]) -> None:
        """The queues live workers serve now (replacing the last set; at most :data:`SERVED_QUEUES_MAX`).

        Series of a queue that stops being served stay until the process restarts (they stop
        moving); the set only decides which new values become labels.
        """
        served: set[str] = set()
        for queue in queues:
            if len(served) >= SERVED_QUEUES_MAX:
                break
            served.add(queue)
        self._queues = self._own_queues | served

    # -- hot-path helpers (label children cached: these run per task) ----------

    def prepare(self, queues: Sequence[str], concurrency: dict[str, int]) -> None:
        """Create the per-queue series at 0 (so ``rate()`` and alerts work before the first event),
        and the ``(unserved)`` ready depth."""
        self.queue_depth.labels(UNSERVED_QUEUE, "ready")
        for queue in queues:
            self.tasks_created.labels(queue)
            self.in_flight.labels(queue).set(0)
            self.concurrency.labels(queue).set(concurrency.get(queue, 0))
            for state in ("ready", "delayed", "running", "dead_letter"):
                self.queue_depth.labels(queue, state)
            self.queue_oldest_ready_age.labels(queue)
            self.queue_paused.labels(queue)
        for store in ("postgres", "redis"):
            self.store_errors.labels(store)

    def run_started(self, queue: str, task_name: str, wait_seconds: float | None) -> None:
        """Count a run whose handler starts, and observe how long its task waited (seconds)."""
        key = (self.queue_label(queue), self.task_label(task_name))
        counter = self._started.get(key)
        if counter is None:
            counter = self._started[key] = self.runs_started.labels(*key)
        counter.inc()
        if wait_seconds is not None:
            hist = self._waits.get(key)
            if hist is None:
                hist = self._waits[key] = self.queue_wait.labels(*key)
            hist.observe(max(0.0, wait_seconds))

    def run_finished(self, queue: str, task_name: str, outcome: str, duration_seconds: float | None) -> None:
        """Count a finished run by outcome (``retry`` is exposed as ``retrying``) and observe its duration."""
        labels = (self.queue_label(queue), self.task_label(task_name))
        key = (*labels, OUTCOME_LABELS.get(outcome, outcome))
        counter = self._finished.get(key)
        if counter is None:
            counter = self._finished[key] = self.runs_finished.labels(*key)
        counter.inc()
        if duration_seconds is not None:
            hist = self._durations.get(labels)
            if hist is None:
                hist = self._durations[labels] = self.run_duration.labels(*labels)
            hist.observe(duration_seconds)

    def task_created(self, queue: str, count: int = 1) -> None:
        """Count ``count`` created tasks of ``queue``."""
        self.tasks_created.labels(self.queue_label(queue)).inc(count)

    def limit_parked(self, parked: Iterable[tuple[str, str]]) -> None:
        """Count admissions refused: ``(task id, limit key)`` pairs, labelled by the key's limit."""
        counts: dict[str, int] = {}
        for _, key in parked:
            name = key.partition(":")[0]
            counts[name] = counts.get(name, 0) + 1
        for name, n in counts.items():
            self.limit_refused.labels(name).inc(n)

    def task_deduplicated(self, queue: str) -> None:
        """Count an enqueue answered by an existing task."""
        self.tasks_deduplicated.labels(self.queue_label(queue)).inc()

    def tasks_repushed_to(self, queue: str, count: int) -> None:
        """Count queued tasks of ``queue`` pushed again into Redis."""
        self.tasks_repushed.labels(self.queue_label(queue)).inc(count)

    def store_failed(self, store: str) -> None:
        """Count one failed store call (``postgres`` or ``redis``)."""
        self.store_errors.labels(store).inc()

    def schema_mismatched(self, operation: str) -> None:
        """Count one statement PostgreSQL refused against its schema (``operation``: the statement's name)."""
        self.store_schema_errors.labels(operation).inc()

    def render(self) -> bytes:
        """The exposition text of every family."""
        return generate_latest(self.registry)

    def markdown(self) -> str:
        """``docs/metrics.md``: every family with its type, labels and meaning."""
        lines = [
            "# Metrics",
            "",
            "Generated from the registry (`python -m taskmesh.observability.metrics_doc > docs/metrics.md`);",
            "a test keeps this file equal to what the code exposes. Every instance serves them at `/metrics`, also",
            "with the API off. *Cluster-wide, sampled* gauges are read from Redis and PostgreSQL by",
            "each instance every `metrics_sample_seconds`: aggregate them with `max by (queue)`.",
            "",
            "Labels are bounded. `task_name` is a name a handler is registered under, else `(other)`",
            "(also for tasks the dev profile's fallback handler runs); `queue` is one of the instance's",
            "`queue_names` or a queue a live worker serves (at most 1,000), else `(unserved)`. Neither",
            "value can be a name, so a client sending random names or queues adds no series.",
            "",
            "| name | type | labels | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for info in self.catalog:
            labels = ", ".join(f"`{label}`" for label in info.labels) or "—"
            lines.append(f"| `{info.name}` | {info.type} | {labels} | {info.help} |")
        lines += [
            "",
            "Also the standard collectors of prometheus-client: `process_*` (CPU seconds, resident",
            "memory bytes, open file descriptors, start time), `python_info`, `python_gc_*`.",
            "",
        ]
        return "\n".join(lines)
