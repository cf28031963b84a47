"""The example handlers (examples/handlers.py) on a real instance, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import examples.handlers
import taskmesh
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

REASONS = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error"}


@pytest.fixture(autouse=True)
def example_handlers(registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the examples' handlers into the test's registry; exports go to a temp dir."""
    for name in ("reports.export_csv", "webhooks.deliver"):
        handler = taskmesh.default_registry.get(name)
        assert handler is not None and handler.func.__module__ == examples.handlers.__name__
        registry.add(handler)
    out = tmp_path / "exports"
    monkeypatch.setenv("TASKMESH_EXAMPLES_OUTPUT", str(out))
    return out


@dataclass
class Receiver:
    """A webhook receiver answering each POST with the next of ``answers`` (the last one repeats)."""

    answers: list[tuple[int, dict[str, str]]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line = (await reader.readline()).decode().rstrip("\r\n")
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        method, target, _ = request_line.split(" ", 2)
        self.requests.append({"method": method, "target": target, "headers": headers, "body": json.loads(body)})
        status, extra = self.answers[min(len(self.requests), len(self.answers)) - 1]
        head = f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\nContent-Length: 0\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in extra.items())
        writer.write((head + "\r\n").encode())
        await writer.drain()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks?source=test"


@contextlib.asynccontextmanager
async def receiver(*answers: int | tuple[int, dict[str, str]]) -> AsyncIterator[Receiver]:
    recv = Receiver([a if isinstance(a, tuple) else (a, {}) for a in answers])
    server = await asyncio.start_server(recv.handle, "127.0.0.1", 0)
    recv.port = server.sockets[0].getsockname()[1]
    try:
        yield recv
    finally:
        server.close()
        await server.wait_closed()


async def create(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    r = await client.post("/api/v1/tasks", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["task_id"])


async def settled(client: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    """Wait until the task is completed or failed; return ``{"task": ..., "latest_run": ...}``."""

    async def check() -> Any:
        body = (await client.get(f"/api/v1/tasks/{task_id}")).json()
        return body if body["task"]["status"] in ("completed", "failed") else None

    result: dict[str, Any] = await wait_for(check)
    return result


async def runs_of(client: httpx.AsyncClient, task_id: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = (await client.get(f"/api/v1/tasks/{task_id}/runs")).json()["runs"]
    return runs


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def delivery(url: str) -> dict[str, Any]:
    data = {"report_id": "sales-2024-q4", "total": 1530.5}
    return {"name": "webhooks.deliver", "payload": {"url": url, "event": "report.ready", "data": data}}


async def test_an_export_task_writes_the_rows_as_a_csv_file_and_returns_its_path_and_size(
    start_instance: Any, example_handlers: Path
) -> None:
    payload = {
        "report_id": "sales-2024-q4",
        "columns": ["region", "units", "revenue"],
        "rows": [
            {"region": "north", "units": 12, "revenue": 1530.5, "ignored": "x"},
            {"region": "south, east", "units": 7, "revenue": None},
            {"region": 'say "hi"'},
        ],
    }
    async with start_instance() as inst, http(inst) as client:
        task_id = await create(client, {"name": "reports.export_csv", "payload": payload, "priority": 10})
        body = await settled(client, task_id)

        path = (example_handlers / "sales-2024-q4.csv").resolve()
        content = path.read_bytes()
        assert content == (b'region,units,revenue\r\nnorth,12,1530.5\r\n"south, east",7,\r\n"say ""hi""",,\r\n')
        assert body["task"]["status"] == "completed"
        assert body["latest_run"]["result"] == {"path": str(path), "rows": 3, "bytes": len(content)}

        again = await settled(client, await create(client, {"name": "reports.export_csv", "payload": payload}))
        assert again["latest_run"]["result"] == body["latest_run"]["result"]
        assert path.read_bytes() == content
        assert files_in(example_handlers) == ["sales-2024-q4.csv"]  # no temporary files left behind


async def test_an_export_without_columns_has_every_key_of_every_row_as_a_column_sorted_by_name(
    start_instance: Any, example_handlers: Path
) -> None:
    rows = [{"units": 1, "id": "x"}, {"region": 2.5, "id": "y"}]  # jsonb alone would order id, units, region
    async with start_instance() as inst, http(inst) as client:
        task_id = await create(client, {"name": "reports.export_csv", "payload": {"report_id": "r1", "rows": rows}})
        assert (await settled(client, task_id))["task"]["status"] == "completed"
    assert (example_handlers / "r1.csv").read_bytes() == b"id,region,units\r\nx,,1\r\ny,2.5,\r\n"


async def test_an_export_with_an_unsafe_report_id_fails_at_once_without_writing_anything(
    start_instance: Any, example_handlers: Path
) -> None:
    async with start_instance() as inst, http(inst) as client:
        payload = {"report_id": "../escape", "rows": [{"a": 1}]}
        task_id = await create(client, {"name": "reports.export_csv", "payload": payload})
        body = await settled(client, task_id)
        assert body["task"]["status"] == "failed"
        assert body["task"]["attempts"] == 1
        assert body["latest_run"]["error"].startswith("NonRetryableError: report_id '../escape' must match")
    assert files_in(example_handlers) == []
    assert "escape.csv" not in files_in(example_handlers.parent)


async def test_a_webhook_answered_500_then_200_completes_on_attempt_2_with_the_same_idempotency_key(
    start_instance: Any,
) -> None:
    async with receiver(500, 200) as recv, start_instance() as inst, http(inst) as client:
        task_id = await create(client, delivery(recv.url))
        body = await settled(client, task_id)

        assert body["task"]["status"] == "completed"
        assert body["task"]["attempts"] == 2
        assert body["latest_run"]["attempt"] == 2
        assert body["latest_run"]["result"] == {"status": 200}
        runs = await runs_of(client, task_id)
        assert [r["status"] for r in runs] == ["retrying", "succeeded"]
        assert runs[0]["error"] == "DeliveryError: HTTP 500 from 127.0.0.1:" + str(recv.port)

    assert len(recv.requests) == 2
    for request in recv.requests:
        assert request["method"] == "POST"
        assert request["target"] == "/hooks?source=test"
        assert request["headers"]["idempotency-key"] == task_id
        assert request["headers"]["content-type"] == "application/json"
        assert request["headers"]["host"] == f"127.0.0.1:{recv.port}"
        assert request["body"] == {"event": "report.ready", "data": {"report_id": "sales-2024-q4", "total": 1530.5}}


async def test_a_webhook_answered_404_fails_after_one_attempt(start_instance: Any) -> None:
    async with receiver(404) as recv, start_instance() as inst, http(inst) as client:
        task_id = await create(client, delivery(recv.url))
        body = await settled(client, task_id)

        assert body["task"]["status"] == "failed"
        assert body["task"]["attempts"] == 1
        assert body["latest_run"]["error"].startswith("NonRetryableError: HTTP 404 from 127.0.0.1:")
        assert len(await runs_of(client, task_id)) == 1
    assert len(recv.requests) == 1


async def test_a_webhook_answered_429_waits_the_retry_after_seconds_instead_of_the_backoff(
    start_instance: Any,
) -> None:
    async with receiver((429, {"Retry-After": "0"}), 200) as recv, start_instance() as inst, http(inst) as client:
        task_id = await create(client, delivery(recv.url))
        body = await settled(client, task_id)

        assert body["task"]["status"] == "completed"
        runs = await runs_of(client, task_id)
        assert runs[0]["error"].startswith("Retry: HTTP 429 from 127.0.0.1:")
        assert runs[0]["error"].endswith("Retry-After 0 s")
        assert runs[0]["next_retry_at"] == runs[0]["finished_at"]  # the backoff policy would have said 1 s
    assert len(recv.requests) == 2


async def test_a_webhook_to_a_non_http_url_fails_at_once_without_connecting(start_instance: Any) -> None:
    async with start_instance() as inst, http(inst) as client:
        task_id = await create(client, delivery("https://example.invalid/hooks"))
        body = await settled(client, task_id)
        assert body["task"]["status"] == "failed"
        assert body["task"]["attempts"] == 1
        assert "only http://host[:port]/path URLs are supported" in body["latest_run"]["error"]
