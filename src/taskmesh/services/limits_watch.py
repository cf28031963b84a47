"""Limits watch: every second, the limits set at run time are read into the instance's book
(``limits/live.py``), so that a ``PUT /api/v1/limits/{name}`` on any instance holds on this one within
a second. Tick counts: ``changed`` (limits whose numbers changed).
"""

from __future__ import annotations

from taskmesh.limits import live
from taskmesh.limits.book import LimitBook
from taskmesh.services.base import Counts, run_periodic
from taskmesh.store import PgStore


async def run_once(pg: PgStore, book: LimitBook) -> Counts:
    """Read the limits set at run time once.

    :returns: ``{"changed": n}``.
    :raises StoreError: PostgreSQL failed.
    """
    return {"changed": len(await live.read(book, pg))}


async def run(pg: PgStore, book: LimitBook, *, interval: float = live.FRESH_SECONDS) -> None:
    """Read for ever (cancelled by the supervisor)."""
    await run_periodic("limits_watch", lambda: run_once(pg, book), interval=interval)
