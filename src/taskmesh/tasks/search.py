"""Finding tasks: ``GET /api/v1/tasks``'s filters, keyset pages and opaque cursors.

Pages come newest first (``order=desc``, the default) or oldest first, by
``(created_at, id)``. Each page reads at most :data:`WINDOW` rows of one index
(:data:`WINDOW_WITH_ERROR` when ``error`` is given)
(``store/search.sql``): the window's key is the most selective indexed filter given
(``dedup_key``, ``payload.…``, ``tenant_id``, ``name``, ``queue``, or none), the
other filters are applied to the window's rows. A page holds up to ``limit`` tasks;
when the window ended first, the page is shorter, ``partial`` is true, and
``next_cursor`` goes on from where the window stopped. ``next_cursor`` is ``None``
at the end. Items carry no payload or result (``GET /api/v1/tasks/{id}`` has them).
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import orjson

from taskmesh.errors import InvalidTaskError
from taskmesh.store import PgStore
from taskmesh.store.search_queries import INFINITY, NEGATIVE_INFINITY, Order, SearchFilter
from taskmesh.tasks.records import task_summary_to_dict
from taskmesh.tasks.states import TaskStatus
from taskmesh.tasks.validation import NAME_REGEX, check_json

WINDOW = 10_000
"""Most index rows one page reads."""
WINDOW_WITH_ERROR = 2_000
"""Most index rows one page reads when ``error`` is given: each row's latest run is read and searched
(measured over 200,000 tasks: 131 ms for a window of 10,000, against 3 ms for the other filters)."""
LIMIT_MAX = 500
LIMIT_DEFAULT = 50
FILTERS = (
    "status",
    "queue",
    "name",
    "tenant_id",
    "dedup_key",
    "error",
    "created_after",
    "created_before",
    "finished_after",
    "finished_before",
    "order",
    "limit",
    "cursor",
)
_NAME = re.compile(NAME_REGEX)
_PATH = re.compile(r"^payload(\.[A-Za-z0-9_-]{1,128}){1,16}$")
STATUSES = ", ".join(s.value for s in TaskStatus)
START = {
    "desc": (INFINITY, uuid.UUID(int=(1 << 128) - 1)),
    "asc": (NEGATIVE_INFINITY, uuid.UUID(int=0)),
}


def parse_search(params: Iterable[tuple[str, str]]) -> tuple[SearchFilter, Order, tuple[datetime, uuid.UUID], int]:
    """The filter, order, start and limit of a search's query parameters.

    :param params: ``(name, value)`` pairs, repeated names kept (``status`` may repeat).
    :raises InvalidTaskError: an unknown parameter or a bad value, naming it (422).
    """
    statuses: list[str] = []
    single: dict[str, str] = {}
    payload: dict[str, Any] = {}
    params = list(params)
    unknown = [
        (name, "unknown filter")
        for name in dict.fromkeys(n for n, _ in params)
        if name not in FILTERS and not name.startswith("payload.")
    ]
    if unknown:
        # Every misspelt name at once, so that fixing one does not just reveal the next.
        raise InvalidTaskError(unknown[0][0], unknown[0][1], unknown)
    for name, value in params:
        if name == "status":
            for part in value.split(","):
                if part not in {s.value for s in TaskStatus}:
                    raise InvalidTaskError("status", f"must be one of {STATUSES}")
                statuses.append(part)
        elif name.startswith("payload."):
            if not _PATH.match(name):
                raise InvalidTaskError(name, "must be payload.<field>[.<field>...] (letters, digits, _ and -)")
            scalar = payload_scalar(value)
            if "\x00" in value or (isinstance(scalar, str) and "\x00" in scalar):
                raise InvalidTaskError(name, "contains a NUL character")  # PostgreSQL's jsonb cannot hold one
            _merge(payload, name.split(".")[1:], scalar)
        else:
            if name in single:
                raise InvalidTaskError(name, "given twice")
            single[name] = value
    for key in ("queue", "name"):
        if key in single and not _NAME.fullmatch(single[key]):
            raise InvalidTaskError(key, "must match [A-Za-z0-9_.:-]{1,128}")
    for key, most in (("tenant_id", 128), ("dedup_key", 512), ("error", 200)):
        if key in single:
            if not 1 <= len(single[key]) <= most:
                raise InvalidTaskError(key, f"must be 1 to {most} characters")
            check_json(single[key], key)
    order = single.get("order", "desc")
    if order not in ("desc", "asc"):
        raise InvalidTaskError("order", "must be desc (newest first) or asc (oldest first)")
    limit = parse_limit(single.get("limit"))
    search = SearchFilter(
        statuses=list(dict.fromkeys(statuses)),
        queue=single.get("queue"),
        name=single.get("name"),
        tenant_id=single.get("tenant_id"),
        dedup_key=single.get("dedup_key"),
        payload=orjson.dumps(payload).decode() if payload else None,
        error=single.get("error"),
        created_after=parse_time(single, "created_after"),
        created_before=parse_time(single, "created_before"),
        finished_after=parse_time(single, "finished_after"),
        finished_before=parse_time(single, "finished_before"),
    )
    start = decode_cursor(single["cursor"], order) if "cursor" in single else START[order]
    return search, order, start, limit  # type: ignore[return-value]  # order is checked above


async def search(
    pg: PgStore, f: SearchFilter, order: Order, start: tuple[datetime, uuid.UUID], limit: int
) -> dict[str, Any]:
    """One page: ``{"tasks": [...], "next_cursor": str | None, "partial": bool}``.

    :raises StoreError: PostgreSQL failed.
    """
    window = WINDOW_WITH_ERROR if f.error is not None else WINDOW
    rows = await pg.search.page(f, order, start, window, limit)
    items = [task_summary_to_dict(r) for r in rows]
    if len(rows) == limit:
        last = rows[-1]
        return {"tasks": items, "next_cursor": encode_cursor(last["created_at"], last["id"], order), "partial": False}
    end = await pg.search.window_end(f, order, start, window)
    if end is None or end["scanned"] < window:  # the window reached the end of the index range
        return {"tasks": items, "next_cursor": None, "partial": False}
    return {"tasks": items, "next_cursor": encode_cursor(end["created_at"], end["id"], order), "partial": True}


def encode_cursor(created_at: datetime, task_id: uuid.UUID, order: str) -> str:
    """An opaque cursor: where the next page of this order starts."""
    raw = orjson.dumps({"c": created_at.isoformat(), "i": str(task_id), "o": order})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, order: str) -> tuple[datetime, uuid.UUID]:
    """The start of a page from its cursor.

    :raises InvalidTaskError: not a cursor taskmesh made, or one of the other order.
    """
    try:
        data = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        start = (datetime.fromisoformat(data["c"]), uuid.UUID(data["i"]))
        same_order = data["o"] == order
    except (ValueError, KeyError, TypeError):
        raise InvalidTaskError("cursor", "is not a cursor of a task search") from None
    if not same_order or start[0].tzinfo is None:
        raise InvalidTaskError("cursor", f"is not a cursor of a search in {order} order")
    return start


def parse_limit(raw: str | None) -> int:
    """A ``limit`` query parameter, 1..:data:`LIMIT_MAX` (default :data:`LIMIT_DEFAULT`).

    :raises InvalidTaskError: anything else (422 naming ``limit``).
    """
    if raw is None:
        return LIMIT_DEFAULT
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= LIMIT_MAX:
        raise InvalidTaskError("limit", f"must be an integer between 1 and {LIMIT_MAX}")
    return int(raw)


def parse_time(single: dict[str, str], key: str) -> datetime | None:
    """The RFC 3339 time of query parameter ``key`` in UTC (``None`` when absent).

    :raises InvalidTaskError: not a time with an offset, or outside years 1..9999 in UTC (422 naming ``key``).
    """
    raw = single.get(key)
    if raw is None:
        return None
    # An unencoded "+" of an offset arrives as a space (2026-01-01T00:00:00 01:00).
    text = raw[:-6] + "+" + raw[-5:] if len(raw) > 6 and raw[-6] == " " else raw
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise InvalidTaskError(key, "must be an RFC 3339 time with an offset, e.g. 2026-01-01T12:00:00Z")
    try:
        # In UTC, as PostgreSQL compares it: 9999-12-31T23:59:59-23:00 is past year 9999 there.
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidTaskError(key, "must be between 0001-01-01 and 9999-12-31 in UTC") from None


def payload_scalar(raw: str) -> Any:
    """A payload filter's value: a JSON number, true, false, null or "quoted string"; else the text itself."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    if isinstance(value, dict | list):
        raise InvalidTaskError("payload", "a payload filter's value must be a number, a string, true, false or null")
    return value


def _merge(into: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        nxt = into.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise InvalidTaskError("payload", f"conflicting filters on payload.{part}")
        into = nxt
    if path[-1] in into:
        raise InvalidTaskError("payload." + ".".join(path), "given twice")
    into[path[-1]] = value
