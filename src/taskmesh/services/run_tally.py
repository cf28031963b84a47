"""Runs that ended on this instance, counted by queue and outcome until the sampler adds them up.

The executors count each run they end (:meth:`RunTally.add`, a dict update: nothing on
the hot path touches a store); the sampler takes the counts every
``metrics_sample_seconds`` and adds them to the current minute's rows of
``queue_minutes`` in PostgreSQL (one statement), where every instance's counts meet:
the operator API's throughput and failures per queue (issue 11) and the console's
charts (issue 13) read them there. Counts the sampler could not write are put back and
written with the next ones; counts of an instance killed in between are lost (at most
one sample period's worth).
"""

from __future__ import annotations

from collections.abc import Mapping

from taskmesh.states import Outcome

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
