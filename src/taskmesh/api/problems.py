"""RFC 9457 problem details (``application/problem+json``) for every error the API returns."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

PROBLEM_TYPE = "about:blank"


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
    return Response(orjson.dumps(body), status_code=status, media_type="application/problem+json", headers=headers)


def invalid(field: str, message: str, errors: list[tuple[str, str]] | None = None) -> Response:
    """422: a field failed validation; ``detail`` is ``"<field>: <message>"``."""
    return problem(422, "Invalid request", f"{field}: {message}", errors=errors or [(field, message)])
