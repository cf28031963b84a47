"""Trace ids: taken from a W3C ``traceparent`` or an ``X-Request-ID`` header, else made.

A task's trace id is stored on the task, returned by the API, given to the
handler (``ctx.trace_id``) and carried by every log line about the task on any
instance, so one request can be followed through the API, the queue and the
workers.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping

TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
"""W3C Trace Context, level 1 (https://www.w3.org/TR/trace-context/#traceparent-header)."""
REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")
"""An ``X-Request-ID`` we keep: 1-128 visible ASCII characters."""


def new_trace_id() -> str:
    """A fresh W3C-style trace id: 32 lowercase hex digits (128 random bits)."""
    return secrets.token_hex(16)


def new_trace_ids(count: int) -> list[str]:
    """``count`` fresh trace ids as :func:`new_trace_id` makes them, from one read of the OS's random source."""
    digits = secrets.token_hex(16 * count)
    return [digits[i : i + 32] for i in range(0, 32 * count, 32)]


def trace_id_from_headers(headers: Mapping[str, str]) -> str | None:
    """The trace id a request carries, or ``None``.

    A valid ``traceparent`` wins (its trace-id field); version ``ff`` and the
    all-zero ids are invalid and ignored, as the W3C recommendation says.
    Otherwise an ``X-Request-ID`` of 1-128 visible ASCII characters.

    :param headers: case-insensitive request headers (Starlette's ``Headers``).
    """
    parent = headers.get("traceparent")
    if parent:
        match = TRACEPARENT.fullmatch(parent.strip())
        if match and match.group(1) != "ff" and set(match.group(2)) != {"0"} and set(match.group(3)) != {"0"}:
            return match.group(2)
    request_id = headers.get("x-request-id")
    if request_id and REQUEST_ID.fullmatch(request_id.strip()):
        return request_id.strip()
    return None
