"""Bulk operations: an action on every task a search filter matches.

``POST /api/v1/tasks:bulk`` takes ``{"filter": {...}, "action": "retry" | "replay" |
"cancel" | "delete", "dry_run": bool, "reason": str}``. The filter has the search's
names (``status``, ``queue``, ``payload.customer.id``, …; see :mod:`taskmesh.tasks.search`)
and at least one of them: an action on every task is refused. A dry run walks the
matches at once (at most :data:`DRY_RUN_MOST` of them) and answers their count and a
sample of ids; a real one is stored as an ``operations`` row and answered 202, and
the ``operations`` service of some instance carries it out in batches
(:mod:`taskmesh.services.operations`); ``GET /api/v1/operations/{id}`` shows its
progress.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from taskmesh.errors import InvalidTaskError
from taskmesh.security.tenancy import EVERYTHING, Reach
from taskmesh.store import PgStore
from taskmesh.store.search_queries import SearchFilter
from taskmesh.tasks.records import iso
from taskmesh.tasks.search import START, WINDOW, parse_search
from taskmesh.tasks.states import BulkAction

DRY_RUN_MOST = 100_000
"""Most matches a dry run counts (it says when there are more)."""
SAMPLE = 10
PAGE = 500
NOT_FILTERS = ("order", "limit", "cursor")


class BulkRequest(BaseModel):
    """Body of ``POST /api/v1/tasks:bulk``."""

    model_config = ConfigDict(extra="forbid")

    filter: dict[str, str | int | float | bool | list[str] | None]
    action: BulkAction
    dry_run: bool = False
    reason: str | None = Field(default=None, min_length=1, max_length=500)


def filter_pairs(filter_: dict[str, Any]) -> list[tuple[str, str]]:
    """The filter object as the search's ``(name, value)`` parameters (payload values as JSON).

    :raises InvalidTaskError: no filter, a list where one value is wanted, or a page parameter
        (``filter.cursor: not a filter of a bulk action``).
    """
    if not filter_:
        raise InvalidTaskError("filter", "give at least one filter (an action on every task is refused)")
    pairs: list[tuple[str, str]] = []
    for name, value in filter_.items():
        if name in NOT_FILTERS:
            raise InvalidTaskError(f"filter.{name}", "not a filter of a bulk action")
        if isinstance(value, list):
            if name != "status":
                raise InvalidTaskError(f"filter.{name}", "takes one value (only status takes a list)")
            pairs += [(name, v) for v in value]
        elif isinstance(value, str) and not name.startswith("payload."):
            pairs.append((name, value))
        else:
            pairs.append((name, orjson.dumps(value).decode()))
    return pairs


def parse_filter(filter_: dict[str, Any]) -> SearchFilter:
    """The search filter of a bulk request.

    :raises InvalidTaskError: as :func:`filter_pairs` and the search's parsing, the field under ``filter.``.
    """
    try:
        f, _, _, _ = parse_search(filter_pairs(filter_))
    except InvalidTaskError as exc:
        if exc.field.startswith("filter"):
            raise
        errors = [(f"filter.{field}", message) for field, message in exc.errors]
        raise InvalidTaskError(errors[0][0], errors[0][1], errors) from None
    return f


async def dry_run(pg: PgStore, f: SearchFilter) -> dict[str, Any]:
    """``{"matched", "complete", "sample"}``: how many tasks match now (at most ``DRY_RUN_MOST``).

    :raises StoreError: PostgreSQL failed.
    """
    matched, sample = 0, list[str]()
    cursor = START["asc"]
    while matched < DRY_RUN_MOST:
        rows = await pg.search.page(f, "asc", cursor, WINDOW, PAGE)
        matched += len(rows)
        sample += [str(r["id"]) for r in rows[: SAMPLE - len(sample)]]
        if rows:
            cursor = (rows[-1]["created_at"], rows[-1]["id"])
            continue
        end = await pg.search.window_end(f, "asc", cursor, WINDOW)
        if end is None or end["scanned"] < WINDOW:
            return {"matched": matched, "complete": True, "sample": sample}
        cursor = (end["created_at"], end["id"])
    return {"matched": matched, "complete": False, "sample": sample}


def operation_to_dict(row: Any) -> dict[str, Any]:
    """An ``operations`` row in the API's shape."""
    return {
        "operation_id": str(row["id"]),
        "action": row["action"],
        "status": row["status"],
        "filter": dict(orjson.loads(row["filter"]) if isinstance(row["filter"], str | bytes) else row["filter"]),
        "reason": row["reason"],
        "tenant_id": row["tenant_id"],
        "queues": None if row["queues"] is None else list(row["queues"]),
        "done": row["done"],
        "skipped": row["skipped"],
        "error": row["error"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "finished_at": iso(row["finished_at"]),
    }


async def start(pg: PgStore, req: BulkRequest, reach: Reach = EVERYTHING) -> dict[str, Any]:
    """Store the operation (the ``operations`` service runs it); its row in the API's shape.

    :param reach: the starting key's tenant and queues: the operation acts only on tasks within them.
    :raises StoreError: PostgreSQL failed.
    """
    row = await pg.operations.insert(
        uuid.uuid4(),
        req.action.value,
        orjson.dumps(req.filter).decode(),
        req.reason,
        reach.tenant_id,
        None if reach.queues is None else sorted(reach.queues),
    )
    return operation_to_dict(row)
