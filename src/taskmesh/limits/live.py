"""Limits set at run time reach every process: the ``limits`` table read again when the last read is a
second old (``LimitBook.apply``).

An instance reads it every second (the ``limits_watch`` service), so that its fetchers, mover and
committer hold each key to the numbers just set; a process that only creates tasks (the API, the
client) reads it before a create when its last read is stale (``Tasks.learn``). A row this version
cannot read (written by a newer one) is skipped and logged (``limit_row_unreadable``).
"""

from __future__ import annotations

import time

from pydantic import ValidationError

from taskmesh.errors import StoreError
from taskmesh.limits.book import LimitBook, Override
from taskmesh.limits.settings import LimitSettings
from taskmesh.observability.logs import get_logger
from taskmesh.store import PgStore

log = get_logger("taskmesh.limits")

FRESH_SECONDS = 1.0
"""How old the last read may be before a create reads the limits again."""


async def read(book: LimitBook, pg: PgStore) -> list[str]:
    """Read the limits set at run time into ``book``; returns the names whose limit changed.

    :raises StoreError: PostgreSQL failed (the last read stands).
    """
    overrides: dict[str, Override] = {}
    for row in await pg.limits.list():
        try:
            settings = LimitSettings.model_validate_json(row["settings"])
        except ValidationError as exc:
            log.warning("limit_row_unreadable", limit=row["name"], error=str(exc).splitlines()[0])
            continue
        overrides[row["name"]] = Override(settings, row["updated_at"], row["updated_by"])
    changed = book.apply(overrides)
    book.read_at = time.monotonic()
    if changed:
        log.info("limits_changed", limits=changed)
    return changed


async def refresh(book: LimitBook, pg: PgStore, fresh_seconds: float = FRESH_SECONDS) -> None:
    """:func:`read` when the last read is older than ``fresh_seconds`` (never raises: a failed read keeps
    the last one, logging ``limits_unknown``)."""
    if book.read_at is not None and time.monotonic() - book.read_at < fresh_seconds:
        return
    try:
        await read(book, pg)
    except StoreError as exc:
        log.warning("limits_unknown", error=str(exc))


async def set_limit(book: LimitBook, pg: PgStore, name: str, settings: LimitSettings, updated_by: str | None) -> None:
    """Set limit ``name`` at run time (it overrides the configured one of its name on every instance within a
    second) and read the limits again into ``book``.

    :raises StoreError: PostgreSQL failed; nothing was set.
    """
    async with pg.changing() as tx:
        await tx.limits.upsert(name, settings.model_dump_json(), updated_by)
    log.info("limit_set", limit=name, **settings.model_dump(exclude_none=True))
    await read(book, pg)


async def unset_limit(book: LimitBook, pg: PgStore, name: str) -> bool:
    """Drop what was set at run time for ``name`` (the configured limit of its name, if any, holds again) and read
    the limits again into ``book``; returns whether anything was set.

    :raises StoreError: PostgreSQL failed; nothing was dropped.
    """
    async with pg.changing() as tx:
        removed = await tx.limits.delete(name)
    if removed:
        log.info("limit_unset", limit=name)
        await read(book, pg)
    return removed
