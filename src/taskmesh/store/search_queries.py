"""Typed calls of the task search (``search.sql``): a page, and where its window ended.

The statements are built from the templates of ``search.sql`` once per window key and
direction (a closed set: nothing from a request is put into SQL text), so that each has
a plan that range-scans one index (see migration 0008).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any, Literal

import asyncpg

from taskmesh.store.schema_watch import SchemaWatch
from taskmesh.store.sql import Queries

Key = Literal["all", "status", "queue", "name", "tenant_id", "dedup_key", "payload"]
Order = Literal["desc", "asc"]

KEYS: dict[Key, str] = {
    "all": "$1::text IS NULL",
    # The partial index's own predicate is repeated so that the generic plan can use it.
    "status": "status = $1::text AND status <> 'completed'",
    "queue": "queue = $1::text",
    "name": "name = $1::text",
    "tenant_id": "tenant_id = $1::text",
    "dedup_key": "idempotency_key = $1::text",
    "payload": "payload @> $1::text::jsonb",
}
"""The window's indexed condition per key (``all``: every task, $1 is null)."""
SOURCES: dict[Key, str] = {
    "all": "task_search",
    "status": "tasks",
    "queue": "task_search",
    "name": "task_search",
    "tenant_id": "task_search",
    "dedup_key": "tasks",
    "payload": "tasks",
}
"""The table whose index the window ranges over: the keys that never change are in ``task_search``
(migration 0020), a status and the payload only in ``tasks``."""
INFINITY = datetime.max
"""asyncpg writes ``datetime.max`` as PostgreSQL's ``infinity`` (and ``min`` as ``-infinity``)."""
NEGATIVE_INFINITY = datetime.min
DIRECTIONS: dict[Order, dict[str, str]] = {
    "desc": {"cmp": "<", "dir": "DESC", "rev": "ASC"},
    "asc": {"cmp": ">", "dir": "ASC", "rev": "DESC"},
}


@cache
def search_statements() -> dict[str, str]:
    """``{"search_page:queue:desc": "WITH ...", ...}``: every template for every key and order."""
    text = resources.files("taskmesh.store").joinpath("search.sql").read_text()
    parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.MULTILINE)
    templates = {name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)}
    return {
        f"{name}:{key}:{order}": body.format(key=condition, source=SOURCES[key], **DIRECTIONS[order])
        for name, body in templates.items()
        for key, condition in KEYS.items()
        for order in DIRECTIONS
    }


@dataclass(frozen=True)
class SearchFilter:
    """What a search keeps (``None``: any). Values as the API takes them, validated."""

    statuses: list[str] = field(default_factory=list)
    queue: str | None = None
    name: str | None = None
    tenant_id: str | None = None
    dedup_key: str | None = None
    payload: str | None = None
    """A JSON object the payload must contain (``{"customer": {"id": 42}}``), as text."""
    error: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    queues: list[str] | None = None
    """Any of these queues (a key bound to several queues; the API's ``queue`` takes one)."""

    def key(self) -> tuple[Key, str | None]:
        """The window's key and its value: the most selective indexed filter given.

        One status other than ``completed`` comes before tenant, name and queue: those
        statuses are a small part of a history, mostly completed tasks (migration 0010).
        """
        one_status = self.statuses[0] if len(self.statuses) == 1 and self.statuses[0] != "completed" else None
        ranked: tuple[tuple[Key, str | None], ...] = (
            ("dedup_key", self.dedup_key),
            ("payload", self.payload),
            ("status", one_status),
            ("tenant_id", self.tenant_id),
            ("name", self.name),
            ("queue", self.queue),
        )
        return next(((key, value) for key, value in ranked if value is not None), ("all", None))


class SearchQueries(Queries):
    """The search statements on one executor."""

    def __init__(self, executor: Any, watch: SchemaWatch | None = None) -> None:
        super().__init__(executor, watch)
        self._q = search_statements()

    def _args(self, f: SearchFilter, cursor: tuple[datetime, uuid.UUID], window: int) -> tuple[tuple[Any, ...], Key]:
        key, value = f.key()
        return (
            value,
            f.created_after or NEGATIVE_INFINITY,
            f.created_before or INFINITY,
            cursor[0],
            cursor[1],
            window,
        ), key

    async def page(
        self, f: SearchFilter, order: Order, cursor: tuple[datetime, uuid.UUID], window: int, limit: int
    ) -> list[asyncpg.Record]:
        """Up to ``limit`` matching tasks after ``cursor`` among the next ``window`` rows of the key's index."""
        head, key = self._args(f, cursor, window)
        post = (
            f.statuses,
            f.queue if key != "queue" else None,
            f.name if key != "name" else None,
            f.tenant_id if key != "tenant_id" else None,
            f.error,
            f.finished_after,
            f.finished_before,
            f.queues,
            limit,
        )
        return await self._fetch(f"search_page:{key}:{order}", *head, *post)

    async def window_end(
        self, f: SearchFilter, order: Order, cursor: tuple[datetime, uuid.UUID], window: int
    ) -> asyncpg.Record | None:
        """``created_at, id, scanned`` of the window's last row (``None``: the window was empty)."""
        head, key = self._args(f, cursor, window)
        return await self._fetchrow(f"search_window_end:{key}:{order}", *head)
