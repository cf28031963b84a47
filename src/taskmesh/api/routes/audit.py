"""The audit log's route: ``GET /api/v1/audit`` with ``audit:read``, newest first, keyset pages."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from taskmesh.api.auth import caller, platform_wide, require
from taskmesh.api.deps import StoresDep, json_response, query_parameter
from taskmesh.api.problems import problem_responses
from taskmesh.api.schemas import AuditPage
from taskmesh.errors import InvalidTaskError
from taskmesh.store.search_queries import INFINITY
from taskmesh.tasks.search import parse_limit, parse_time
from taskmesh.tasks.validation import check_json

router = APIRouter()

FILTERS = ("tenant_id", "actor_id", "action", "outcome", "resource_type", "resource_id")
PARAMETERS = (*FILTERS, "since", "limit", "cursor")
OUTCOMES = ("ok", "denied", "error")
LAST_ID = 2**63 - 1


AUDIT_PARAMETERS = [
    query_parameter("tenant_id", {"type": "string", "maxLength": 128}, "Events of this tenant"),
    query_parameter("actor_id", {"type": "string", "maxLength": 128}, "Events of this key id (or OS user of the CLI)"),
    query_parameter("action", {"type": "string", "maxLength": 200}, "task.cancel, queue.pause, key.create, ..."),
    query_parameter("outcome", {"type": "string", "enum": list(OUTCOMES)}, "ok, denied or error"),
    query_parameter("resource_type", {"type": "string", "maxLength": 64}, "task, queue, schedule, key, operation"),
    query_parameter("resource_id", {"type": "string", "maxLength": 200}, "The resource's id or name"),
    query_parameter("since", {"type": "string", "format": "date-time"}, "Events at or after (RFC 3339 with an offset)"),
    query_parameter("limit", {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}, "Events per page"),
    query_parameter("cursor", {"type": "string"}, "The previous page's next_cursor"),
]


def _cursor(raw: str) -> tuple[datetime, int]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        at, event_id = datetime.fromisoformat(data["a"]), int(data["i"])
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError):
        raise InvalidTaskError("cursor", "is not a cursor of the audit log") from None
    if at.tzinfo is None or not 0 <= event_id <= LAST_ID:
        raise InvalidTaskError("cursor", "is not a cursor of the audit log")
    return at, event_id


def _event(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "at": row["at"].isoformat(),
        "actor": {"type": row["actor_type"], "id": row["actor_id"], "name": row["actor_name"]},
        **{
            k: row[k]
            for k in (
                "tenant_id",
                "action",
                "resource_type",
                "resource_id",
                "outcome",
                "status",
                "reason",
                "trace_id",
                "client_addr",
                "user_agent",
            )
        },
        "details": None if row["details"] is None else orjson.loads(row["details"]),
    }


@router.get(
    "/api/v1/audit",
    operation_id="listAuditEvents",
    tags=["audit"],
    response_model=AuditPage,
    dependencies=[Depends(require("audit:read"))],
    responses=problem_responses(422),
    openapi_extra={"parameters": AUDIT_PARAMETERS},
    summary="The audit log, newest first: who changed what, and every refused call; keyset pages",
)
async def list_audit(request: Request, stores: StoresDep) -> Response:
    """Up to ``limit`` (1..500, 50) events, with the filters given; ``{"events", "next_cursor"}``.

    A key bound to a tenant reads its tenant's events only; one bound to queues (and no tenant) is refused.
    """
    params = list(request.query_params.multi_items())
    unknown = [(n, "unknown filter") for n in dict.fromkeys(n for n, _ in params) if n not in PARAMETERS]
    if unknown:
        raise InvalidTaskError(unknown[0][0], unknown[0][1], unknown)
    single = dict(params)
    if single.get("outcome") not in (None, *OUTCOMES):
        raise InvalidTaskError("outcome", f"must be one of {', '.join(OUTCOMES)}")
    for name in FILTERS:
        if len(single.get(name, "")) > 200:
            raise InvalidTaskError(name, "must be at most 200 characters")
        check_json(single.get(name), name)  # a NUL character, which PostgreSQL cannot compare
    limit = parse_limit(single.get("limit"))
    since = parse_time(single, "since")
    start = _cursor(single["cursor"]) if "cursor" in single else (INFINITY, LAST_ID)
    tenant = caller(request).tenant_id
    if tenant is None:
        platform_wide(request, "audit:read", "the audit log", every_queue=True)
    elif single.get("tenant_id", tenant) != tenant:
        return json_response({"events": [], "next_cursor": None})
    filters = tuple(tenant if name == "tenant_id" and tenant else single.get(name) for name in FILTERS)
    rows = await stores.pg.audit.page(start, filters, since, limit + 1)  # type: ignore[arg-type]
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = None
    if more:
        last = rows[-1]
        raw = orjson.dumps({"a": last["at"].isoformat(), "i": last["id"]})
        cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return json_response({"events": [_event(r) for r in rows], "next_cursor": cursor})
