"""Denial summaries: the audit rows of repeated refusals, once their window ended.

Every ``interval`` seconds (default 5) it takes the summaries :class:`taskmesh.api.denials.Denials`
has ready (one ``denied.repeated`` row per kind of refusal whose minute ended with more than
its first) and inserts them into ``audit_events``, each also logged as an ``audit`` line. When
the instance stops it writes the open kinds' counts too (within 2 s). Tick counts: ``written``.

A PostgreSQL outage keeps the unwritten summaries for the next tick (at most
``2 x kinds_most`` of them) and backs off as every periodic service does.
"""

from __future__ import annotations

import anyio

from taskmesh.api.denials import SUMMARY_ACTION, Denials
from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.security import audit
from taskmesh.services.base import Counts, run_periodic
from taskmesh.store import PgStore

log = get_logger("taskmesh.security.audit")

FINAL_WRITE_SECONDS = 2.0
"""Most time the last write gets when the instance stops."""


async def run_once(pg: PgStore, denials: Denials, *, everything: bool = False) -> Counts:
    """Write the summaries that are due (every open kind's with ``everything``).

    :raises StoreError: PostgreSQL failed (the unwritten ones are kept for the next tick).
    """
    summaries = denials.due(everything=everything)
    written = 0
    try:
        for event in summaries:
            await audit.write(pg, event)
            audit.emit(event)
            written += 1
    except StoreError:
        denials.keep(summaries[written:])
        raise
    return {"written": written} if written else {}


async def run(pg: PgStore, denials: Denials, *, interval: float = 5.0) -> None:
    """Tick for ever (cancelled by the supervisor), then write what is still counted."""
    try:
        await run_periodic("denial_summaries", lambda: run_once(pg, denials), interval=interval)
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_SECONDS):
            try:
                await run_once(pg, denials, everything=True)
            except StoreError as exc:  # stopping during an outage: say what is lost
                log.warning("audit_unwritten", action=SUMMARY_ACTION, error=str(exc))
