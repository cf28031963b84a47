"""ASGI middleware: refuse request bodies over a size limit with 413 before the app reads them."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskmesh.api.problems import problem

MAX_BODY_BYTES = 1024 * 1024
"""Largest request body accepted, bytes (1 MiB)."""


class BodyLimit:
    """Reads the whole body (up to ``limit`` bytes) before the app runs.

    A declared ``Content-Length`` over the limit is refused at once; a body
    that streams past the limit is refused when it does. Either way the answer
    is 413 problem+json and nothing reaches the app.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._refuse(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(
            413,
            "Request body too large",
            f"body: larger than {self.limit} bytes",
            errors=[("body", f"larger than {self.limit} bytes")],
        )
        await response(scope, receive, send)
