"""Prometheus metrics of one instance (``taskmesh_`` prefix, base units, bounded labels).

Labels are queue, task name and outcome only, never a task id. Each instance
(and each test) owns its own :class:`Metrics` with its own registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

RUN_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class Metrics:
    """The instance's metric families.

    - ``taskmesh_tasks_created_total{queue}``: tasks written by enqueue (not dedup hits).
    - ``taskmesh_tasks_deduplicated_total{queue}``: enqueues answered by an existing task.
    - ``taskmesh_runs_finished_total{queue,task_name,outcome}``: outcome is
      succeeded, retry, failed or interrupted.
    - ``taskmesh_run_duration_seconds{queue,task_name}``: handler wall time.
    - ``taskmesh_queue_depth{queue,state}``: ready, delayed and dlq sizes in Redis,
      sampled at each scrape.
    - ``taskmesh_redis_push_failures_total``: pushes left to the re-push service.
    - ``taskmesh_tasks_repushed_total{queue}``: queued tasks pushed again by the reconciler.
    - ``taskmesh_late_results_total``: results dropped because their run lost its lease.
    - ``taskmesh_runs_reclaimed_total{outcome}``: runs ended by the reclaimer (queued, failed, cancelled).
    - ``taskmesh_redis_resyncs_total``: full resyncs after Redis lost its data.
    - ``taskmesh_schedule_fires_total{schedule,outcome}``: fire times of cron schedules by what
      was done: fired, misfire_fired, misfire_skipped, overlap_skipped, triggered, duplicate.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.tasks_created = Counter("taskmesh_tasks_created", "Tasks created.", ["queue"], registry=r)
        self.tasks_deduplicated = Counter(
            "taskmesh_tasks_deduplicated", "Enqueues answered by an existing task.", ["queue"], registry=r
        )
        self.runs_finished = Counter(
            "taskmesh_runs_finished", "Runs finished, by outcome.", ["queue", "task_name", "outcome"], registry=r
        )
        self.run_duration = Histogram(
            "taskmesh_run_duration_seconds",
            "Handler wall time of a run.",
            ["queue", "task_name"],
            buckets=RUN_DURATION_BUCKETS,
            registry=r,
        )
        self._finished: dict[tuple[str, str, str], Counter] = {}
        self._durations: dict[tuple[str, str], Histogram] = {}
        self.queue_depth = Gauge("taskmesh_queue_depth", "Task ids waiting in Redis.", ["queue", "state"], registry=r)
        self.redis_push_failures = Counter(
            "taskmesh_redis_push_failures", "Redis pushes that failed (re-pushed later).", registry=r
        )
        self.late_results = Counter(
            "taskmesh_late_results", "Run results dropped because the run had lost its lease.", registry=r
        )
        self.runs_reclaimed = Counter(
            "taskmesh_runs_reclaimed", "Runs ended by the reclaimer after their lease expired.", ["outcome"], registry=r
        )
        self.redis_resyncs = Counter(
            "taskmesh_redis_resyncs", "Full resyncs of Redis from Postgres after a flush or restart.", registry=r
        )
        self.tasks_repushed = Counter(
            "taskmesh_tasks_repushed", "Queued tasks pushed again into Redis.", ["queue"], registry=r
        )
        self.schedule_fires = Counter(
            "taskmesh_schedule_fires",
            "Fire times of cron schedules, by outcome.",
            ["schedule", "outcome"],
            registry=r,
        )

    def run_finished(self, queue: str, task_name: str, outcome: str, duration_seconds: float) -> None:
        """Count a finished run and observe its duration (label children cached: this is per run)."""
        key = (queue, task_name, outcome)
        counter = self._finished.get(key)
        if counter is None:
            counter = self._finished[key] = self.runs_finished.labels(queue, task_name, outcome)
        counter.inc()
        hist = self._durations.get((queue, task_name))
        if hist is None:
            hist = self._durations[(queue, task_name)] = self.run_duration.labels(queue, task_name)
        hist.observe(duration_seconds)

    def render(self) -> bytes:
        """The exposition text of every family."""
        return generate_latest(self.registry)
