"""Clock sync: measures PostgreSQL's clock against this host's, so due times use one clock.

Every ``interval`` seconds (default 30) it reads ``clock_timestamp()`` and sets
the offset of the instance's :class:`~taskmesh.runtime.clock.StoreClock` (PostgreSQL's
time minus this host's, from the midpoint of the round trip), and the gauge
``taskmesh_clock_offset_seconds``. An offset beyond ``warn_seconds`` (1 s) is
logged at warning (``clock_skew``) when first seen and whenever it moves by
more than that again: the instance keeps working on PostgreSQL's clock, but
its host's clock needs NTP. Tick counts: none.
"""

from __future__ import annotations

from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import Metrics
from taskmesh.runtime.clock import StoreClock
from taskmesh.services.base import Counts, run_periodic
from taskmesh.store import PgStore

log = get_logger("taskmesh.runtime.clock")

WARN_SECONDS = 1.0


class _Reported:
    offset = 0.0


async def run_once(
    pg: PgStore, clock: StoreClock, metrics: Metrics | None = None, reported: _Reported | None = None
) -> Counts:
    """Measure once.

    :raises StoreError: PostgreSQL failed (the old offset stays).
    """
    offset = await clock.sync(pg.now)
    if metrics is not None:
        metrics.clock_offset.set(offset)
    if reported is not None and abs(offset) > WARN_SECONDS and abs(offset - reported.offset) > WARN_SECONDS:
        reported.offset = offset
        log.warning("clock_skew", offset_s=round(offset, 3), hint="this host's clock differs from PostgreSQL's")
    return {}


async def run(pg: PgStore, clock: StoreClock, metrics: Metrics | None, *, interval: float = 30.0) -> None:
    """Tick for ever (cancelled by the supervisor)."""
    reported = _Reported()
    await run_periodic("clock_sync", lambda: run_once(pg, clock, metrics, reported), interval=interval)
