"""The console's way to the data and actions: the instance's own HTTP API, called in-process.

Every page reads through the same routes a client calls, and every action the console offers
is the same API call, sent with the visitor's session (its cookie and CSRF token), from the
visitor's own address and user agent. So the console gets nothing the visitor's key could not
get from the API: the same scopes, tenant rule, rate limit, validation, and audit record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson
from starlette.requests import Request

from taskmesh.console import sessions
from taskmesh.console.web import Visitor

TIMEOUT_SECONDS = 30.0
"""Longest an in-process call may take (a bulk dry run counts up to 100,000 tasks)."""


@dataclass(frozen=True)
class Answer:
    """An API answer: its status, its decoded JSON body (``{}`` for none) and, for a 429, its ``Retry-After``."""

    status: int
    body: Any
    retry_after: str | None = None

    @property
    def ok(self) -> bool:
        """A status below 400."""
        return self.status < 400

    @property
    def problem(self) -> str:
        """A problem answer in one line: its title and detail (``""`` for a success)."""
        if self.ok:
            return ""
        if isinstance(self.body, dict):
            title, detail = self.body.get("title", ""), self.body.get("detail", "")
            return f"{title}: {detail}" if detail else str(title)
        return f"HTTP {self.status}"


class ConsoleApi:
    """Calls the API of ``request``'s own app as ``who``.

    :param request: the console request being answered (its app, Host, client address, user agent).
    :param who: the visitor, whose session the calls carry.
    """

    def __init__(self, request: Request, who: Visitor) -> None:
        client = request.client
        transport = httpx.ASGITransport(
            app=request.app,
            client=(client.host, client.port) if client is not None else ("127.0.0.1", 0),
        )
        headers = {
            "host": request.headers.get("host", "localhost"),
            "cookie": f"{sessions.COOKIE}={who.cookie}",
            sessions.CSRF_HEADER: who.session.csrf_token,
            "sec-fetch-site": "same-origin",
            "user-agent": request.headers.get("user-agent", "taskmesh-console"),
        }
        for name in ("x-request-id", "traceparent"):
            if name in request.headers:
                headers[name] = request.headers[name]
        self._http = httpx.AsyncClient(
            transport=transport, base_url="http://console.internal", headers=headers, timeout=TIMEOUT_SECONDS
        )

    async def __aenter__(self) -> ConsoleApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def get(self, path: str, params: list[tuple[str, str]] | dict[str, str] | None = None) -> Answer:
        """``GET path`` with ``params`` in its query."""
        return await self._send("GET", path, params=params)

    async def get_all(self, *calls: tuple[str, dict[str, str] | None]) -> list[Answer]:
        """Several ``GET`` calls at once (a page that reads three routes waits for the slowest, not the sum)."""
        answers: list[Answer | None] = [None] * len(calls)

        async def one(i: int, path: str, params: dict[str, str] | None) -> None:
            answers[i] = await self.get(path, params)

        async with anyio.create_task_group() as tg:
            for i, (path, params) in enumerate(calls):
                tg.start_soon(one, i, path, params)
        return [a for a in answers if a is not None]

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Answer:
        """``POST path`` with a JSON body (none for ``None``)."""
        return await self._send("POST", path, body=body)

    async def put(self, path: str, body: dict[str, Any]) -> Answer:
        """``PUT path`` with a JSON body."""
        return await self._send("PUT", path, body=body)

    async def delete(self, path: str, params: dict[str, str] | None = None) -> Answer:
        """``DELETE path`` with ``params`` in its query."""
        return await self._send("DELETE", path, params=params)

    async def _send(
        self,
        method: str,
        path: str,
        params: list[tuple[str, str]] | dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Answer:
        content = None if body is None else orjson.dumps(body)
        headers = {"content-type": "application/json"} if content is not None else None
        pairs = tuple(params.items()) if isinstance(params, dict) else tuple(params or ())
        query = httpx.QueryParams(pairs) if pairs else None
        response = await self._http.request(method, path, params=query, content=content, headers=headers)
        try:
            decoded = response.json() if response.content else {}
        except ValueError:
            decoded = {"title": f"HTTP {response.status_code}", "detail": response.text[:200]}
        return Answer(response.status_code, decoded, response.headers.get("retry-after"))


def refusal(primary: Sequence[Answer], secondary: Sequence[Answer] = ()) -> Answer | None:
    """The answer whose status a page that shows these reads answers with, as the API did: a 429 among any
    of them (the page is not whole: come back later), else the first of its ``primary`` reads that the API
    refused (a 403 page is a refusal, not a page). ``None``: the page is whole (200).

    :param primary: the reads the page is about (a queue list, a search).
    :param secondary: reads for a part of the page (the overview's workers), shown refused in place.
    """
    for answer in (*primary, *secondary):
        if answer.status == 429:
            return answer
    return next((answer for answer in primary if not answer.ok), None)
