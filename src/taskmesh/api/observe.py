"""ASGI middleware: count HTTP requests and their latency by route template.

The route label is the matched template (``/api/v1/tasks/{task_id}``), never the
raw path, so ids do not become series; requests matching no route count as
``unmatched``.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskmesh.observability.metrics import Metrics


class ObserveRequests:
    """Counts ``taskmesh_http_requests_total`` and observes ``taskmesh_http_request_duration_seconds``."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception that escapes everything still answers 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            self.metrics.http_requests.labels(template, method, str(status)).inc()
            self.metrics.http_duration.labels(template, method).observe(time.perf_counter() - started)
