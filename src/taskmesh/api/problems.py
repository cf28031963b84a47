"""RFC 9457 problem details (``application/problem+json``) for every error the API returns."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

PROBLEM_TYPE = "about:blank"
PROBLEM_MEDIA_TYPE = "application/problem+json"


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    errors: list[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    """A problem+json response.

    :param errors: ``(field, message)`` pairs, rendered as ``errors: [{"field", "message"}]``;
        the first one is usually repeated in ``detail``.
    :param headers: more response headers (``Allow`` of a 405).
    """
    body: dict[str, Any] = {"type": PROBLEM_TYPE, "title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = [{"field": f, "message": m} for f, m in errors]
    body.update(extra)
    return Response(orjson.dumps(body), status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def invalid(field: str, message: str, errors: list[tuple[str, str]] | None = None) -> Response:
    """422: a field failed validation; ``detail`` is ``"<field>: <message>"``."""
    return problem(422, "Invalid request", f"{field}: {message}", errors=errors or [(field, message)])


PROBLEM_SCHEMA: dict[str, Any] = {"$ref": "#/components/schemas/Problem"}
"""Every error answer's schema: :class:`taskmesh.api.schemas.Problem`, shared (``api/contract.py`` adds it)."""
ERROR_STATUSES: dict[int, str] = {
    400: "Malformed JSON (`Malformed JSON`), or a `Host` not in `allowed_hosts` (`Host not allowed`)",
    401: "No usable API key: none, malformed, unknown, revoked or expired (`Unauthorized`, with `WWW-Authenticate`)",
    403: "The key lacks the route's scope (`Forbidden`, naming the `scope`), or a field is beyond its tenant or queues",
    404: "No such task, operation, schedule, workflow, key or limit (a problem naming it)",
    409: "The task's state does not allow this (`Task state conflict`, saying what would); or, during an upgrade "
    "before its contract step, another tenant's task has the dedup key (`Dedup key in use`)",
    413: "The body is over the size limit (`http_max_body_bytes`)",
    415: "The body is not `application/json` (`Unsupported media type`)",
    429: (
        "The key spent its rate limit for this class of requests, or the client's address its budget of refused "
        "authentications (`Too many requests`, `Retry-After`, `RateLimit`; `policy` names which)"
    ),
    422: "A field or parameter failed validation (`Invalid request`: `detail` and `errors` name each field)",
    500: "The server failed to answer (`Internal error`), or PostgreSQL refused a statement against its schema "
    "(`Schema mismatch`: this release and the database's schema disagree); the error is logged",
    503: "PostgreSQL or Redis is unavailable (`Store unavailable`, naming it), or not yet connected (`Not ready`)",
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses`` for the OpenAPI document: each error status as problem+json.

    :param statuses: keys of :data:`ERROR_STATUSES`; 400 (a ``Host`` not allowed), 401, 403 and
        429 (every route is guarded by a scope and a rate limit), 500 and 503 (any store call may meet
        an outage) are added to every route, and 415 to every route that takes a body (those given 413).
    :raises KeyError: a status without a description in :data:`ERROR_STATUSES`.
    """
    return only_problems(*statuses, 400, 401, 403, 429, 500, 503, *((415,) if 413 in statuses else ()))


def only_problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses`` of exactly ``statuses`` (keys of :data:`ERROR_STATUSES`), each as problem+json."""
    return {
        status: {
            "description": ERROR_STATUSES[status],
            "content": {"application/problem+json": {"schema": PROBLEM_SCHEMA}},
        }
        for status in sorted(set(statuses))
    }
