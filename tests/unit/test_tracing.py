"""Trace ids from request headers (W3C traceparent, X-Request-ID)."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from taskmesh.observability.tracing import new_trace_id, trace_id_from_headers

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}, TRACE),
        ({"Traceparent": f" 00-{TRACE}-00f067aa0ba902b7-00 "}, TRACE),
        ({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01", "x-request-id": "req-1"}, TRACE),
        ({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "x-request-id": "req-1"}, "req-1"),
        ({"traceparent": f"00-{TRACE}-" + "0" * 16 + "-01"}, None),
        ({"traceparent": f"ff-{TRACE}-00f067aa0ba902b7-01"}, None),
        ({"traceparent": f"00-{TRACE.upper()}-00f067aa0ba902b7-01"}, None),
        ({"traceparent": "garbage"}, None),
        ({"X-Request-ID": "req-7f3a"}, "req-7f3a"),
        ({"x-request-id": "has space"}, None),
        ({"x-request-id": "x" * 129}, None),
        ({}, None),
    ],
)
def test_trace_ids_come_from_a_valid_traceparent_or_request_id(headers: dict[str, str], expected: str | None) -> None:
    assert trace_id_from_headers(Headers(headers)) == expected


def test_new_trace_ids_are_32_hex_digits_and_differ() -> None:
    a, b = new_trace_id(), new_trace_id()
    assert len(a) == 32 and int(a, 16) >= 0 and a != b
