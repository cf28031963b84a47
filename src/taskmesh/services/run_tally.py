"""Runs that ended on this instance, counted by queue and outcome until the sampler adds them up,
and how long the runs it started had waited, as a histogram by queue.

The executors count each run they start (:meth:`RunTally.waited`) and end (:meth:`RunTally.add`),
a dict update each: nothing on the hot path touches a store; the sampler takes the counts every
``metrics_sample_seconds`` and adds them to the current minute's rows of
``queue_minutes`` in PostgreSQL (one statement), where every instance's counts meet:
the operator API's throughput and failures per queue and the console's
charts read them there. Counts the sampler could not write are put back and
written with the next ones; counts of an instance killed in between are lost (at most
one sample period's worth).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from taskmesh.observability.metrics import DURATION_BUCKETS
from taskmesh.tasks.states import Outcome

WAIT_BOUNDS_SECONDS: tuple[float, ...] = tuple(float(b) for b in DURATION_BUCKETS)
"""Upper bounds of the wait histogram's buckets (1 ms to 1 h, as the queue-wait metric's); one more
bucket holds longer waits. ``queue_minutes.wait_counts[i]`` counts runs that waited at most bound ``i``."""

COLUMNS: dict[Outcome, str] = {
    Outcome.SUCCEEDED: "succeeded",
    Outcome.RETRY: "retried",
    Outcome.FAILED: "failed",
    Outcome.CANCELLED: "cancelled",
    Outcome.INTERRUPTED: "interrupted",
}
"""The ``queue_minutes`` column of each outcome."""


class RunTally:
    """Ended runs by queue and ``queue_minutes`` column, since the last :meth:`take`."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = {}
        self._waits: dict[str, list[int]] = {}

    def waited(self, queue: str, seconds: float) -> None:
        """Count one run of ``queue`` that started ``seconds`` after its task was due."""
        counts = self._waits.get(queue)
        if counts is None:
            counts = self._waits[queue] = [0] * (len(WAIT_BOUNDS_SECONDS) + 1)
        counts[bisect.bisect_left(WAIT_BOUNDS_SECONDS, seconds)] += 1

    def take_waits(self) -> dict[str, list[int]]:
        """The wait histograms so far, ``{queue: counts by bucket}``; counting starts again from zero."""
        waits, self._waits = self._waits, {}
        return waits

    def put_back_waits(self, waits: Mapping[str, list[int]]) -> None:
        """Add histograms that could not be written back, to be taken with the next ones."""
        for queue, counts in waits.items():
            mine = self._waits.setdefault(queue, [0] * len(counts))
            for i, n in enumerate(counts):
                mine[i] += n

    def add(self, queue: str, outcome: Outcome) -> None:
        """Count one run of ``queue`` that ended with ``outcome``."""
        by_column = self._counts.setdefault(queue, {})
        column = COLUMNS[outcome]
        by_column[column] = by_column.get(column, 0) + 1

    def take(self) -> dict[str, dict[str, int]]:
        """The counts so far, ``{queue: {column: runs}}``; counting starts again from zero."""
        counts, self._counts = self._counts, {}
        return counts

    def put_back(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """Add counts that could not be written back, to be taken with the next ones."""
        for queue, by_column in counts.items():
            mine = self._counts.setdefault(queue, {})
            for column, n in by_column.items():
                mine[column] = mine.get(column, 0) + n
