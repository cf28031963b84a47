"""Example handlers: a CSV export (sync, runs in a worker thread) and a webhook delivery (async).

Run them on an embedded PostgreSQL and Valkey, from the repository root::

    TASKMESH_HANDLERS=examples.handlers python -m taskmesh dev

The HTTP API listens on 127.0.0.1:8080. Create an export; the file lands in
``$TASKMESH_EXAMPLES_OUTPUT`` (default ``./exports``) as ``sales-2024-q4.csv``::

    curl -s -X POST http://127.0.0.1:8080/api/v1/tasks \\
      -H 'Content-Type: application/json' \\
      -d '{"name": "reports.export_csv",
           "payload": {"report_id": "sales-2024-q4",
                       "columns": ["region", "units", "revenue"],
                       "rows": [{"region": "north", "units": 12, "revenue": 1530.5},
                                {"region": "south", "units": 7, "revenue": null}]},
           "queue_name": "default", "priority": 10, "dedup_key": "export:sales-2024-q4"}'

Deliver a webhook to a receiver on port 9000 (any HTTP server that accepts a
POST; with none listening you can watch the retries: 1, 2, 4, 8, 16 s apart,
then the task is ``failed``)::

    curl -s -X POST http://127.0.0.1:8080/api/v1/tasks \\
      -H 'Content-Type: application/json' \\
      -d '{"name": "webhooks.deliver",
           "payload": {"url": "http://127.0.0.1:9000/hooks", "event": "report.ready",
                       "data": {"report_id": "sales-2024-q4"}},
           "max_retries": 5, "dedup_key": "webhook:sales-2024-q4:report.ready"}'

Each answers ``{"task_id": "...", "status": "queued"}``; follow the task with
``curl -s http://127.0.0.1:8080/api/v1/tasks/<task_id>`` (its latest run holds
the handler's result or error) and ``.../tasks/<task_id>/runs`` (every attempt).

Both handlers are idempotent, as taskmesh requires: a retried export rewrites
the same file atomically, and every attempt of a delivery carries the same
``Idempotency-Key`` header (the task id), on which receivers deduplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

import taskmesh

# --- reports.export_csv -------------------------------------------------------

MAX_ROWS = 100_000
REPORT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
OUTPUT_ENV = "TASKMESH_EXAMPLES_OUTPUT"

Cell = str | int | float | None


class ExportRequest(BaseModel):
    """Payload of ``reports.export_csv``.

    :param report_id: names the file ``{report_id}.csv``; ``[A-Za-z0-9_-]{1,64}``.
    :param rows: the records, at most 100,000; a missing key is an empty cell.
    :param columns: header and column order; keys not listed are left out.
        Default: every key of every row, sorted (JSON objects have no reliable
        key order: PostgreSQL's jsonb, where payloads are stored, reorders them).
    """

    report_id: str
    rows: list[dict[str, Cell]] = Field(max_length=MAX_ROWS)
    columns: list[str] | None = None


@taskmesh.task("reports.export_csv")
def export_csv(payload: ExportRequest) -> dict[str, Any]:
    """Write ``payload.rows`` to ``$TASKMESH_EXAMPLES_OUTPUT/{report_id}.csv``.

    The file is written under a temporary name in the same directory and
    renamed into place, so readers never see half a file and a retry (or a
    run still going after a timeout) just replaces it with the same content.

    :returns: ``{"path": absolute path, "rows": rows written, "bytes": file size}``.
    :raises NonRetryableError: ``report_id`` is not ``[A-Za-z0-9_-]{1,64}``.
    """
    if not REPORT_ID.fullmatch(payload.report_id):
        raise taskmesh.NonRetryableError(f"report_id {payload.report_id[:80]!r} must match [A-Za-z0-9_-]{{1,64}}")
    columns = payload.columns
    if columns is None:
        columns = sorted({key for row in payload.rows for key in row})
    out_dir = Path(os.environ.get(OUTPUT_ENV) or "./exports").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{payload.report_id}.csv"
    fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=f".{payload.report_id}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
            if columns:
                writer.writeheader()
            writer.writerows(payload.rows)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    return {"path": str(target), "rows": len(payload.rows), "bytes": target.stat().st_size}


# --- webhooks.deliver ---------------------------------------------------------

MAX_RETRY_AFTER_SECONDS = 3600
MAX_HEADER_LINES = 100


class Delivery(BaseModel):
    """Payload of ``webhooks.deliver``: POST ``{"event": ..., "data": ...}`` to ``url`` (``http://`` only)."""

    url: str
    event: str
    data: dict[str, Any]


class DeliveryError(Exception):
    """The receiver could not take the delivery now (5xx, 408, 429, a broken answer): retried."""


@taskmesh.task("webhooks.deliver", timeout=10, max_retries=5)
async def deliver(payload: Delivery, ctx: taskmesh.TaskContext) -> dict[str, int]:
    """POST the event as JSON with ``Idempotency-Key: <task id>``; read the status.

    The handler's 10 s timeout bounds connecting, sending and reading.

    :returns: ``{"status": code}`` for a 2xx answer.
    :raises NonRetryableError: not an ``http://`` URL; a 3xx (not followed) or
        4xx answer other than 408 and 429.
    :raises Retry: 429 with ``Retry-After: <seconds>`` (waits that long, at most an hour).
    :raises DeliveryError, OSError: 5xx, 408, 429 without usable ``Retry-After``,
        no connection, a malformed answer: retried with taskmesh's backoff.
    """
    shown = repr(payload.url[:200])
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in payload.url):
        raise taskmesh.NonRetryableError(f"url {shown} contains whitespace or control characters")
    parts = urlsplit(payload.url)
    if parts.scheme.lower() != "http" or not parts.hostname:
        raise taskmesh.NonRetryableError(f"url {shown}: only http://host[:port]/path URLs are supported")
    try:
        port = parts.port or 80
    except ValueError:
        raise taskmesh.NonRetryableError(f"url {shown} has an invalid port") from None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    body = json.dumps({"event": payload.event, "data": payload.data}, separators=(",", ":")).encode()
    head = (
        f"POST {target} HTTP/1.1\r\n"
        f"Host: {parts.netloc.rpartition('@')[2]}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Idempotency-Key: {ctx.task_id}\r\n"
        "User-Agent: taskmesh-examples\r\n"
        "Connection: close\r\n\r\n"
    )

    reader, writer = await asyncio.open_connection(parts.hostname, port)
    try:
        writer.write(head.encode("ascii") + body)
        await writer.drain()
        status, headers = await _read_head(reader)
        while 100 <= status < 200:  # interim answers (103 Early Hints, ...) precede the real one
            status, headers = await _read_head(reader)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    where = f"{parts.hostname}:{port}"
    if 200 <= status < 300:
        return {"status": status}
    if status == 429:
        retry_after = headers.get("retry-after", "").strip()
        if retry_after.isdigit():
            delay = min(int(retry_after), MAX_RETRY_AFTER_SECONDS)
            raise taskmesh.Retry(f"HTTP 429 from {where}, Retry-After {retry_after} s", delay_seconds=delay)
    if 300 <= status < 400:
        raise taskmesh.NonRetryableError(f"HTTP {status} from {where}: redirects are not followed")
    if 400 <= status < 500 and status not in (408, 429):
        raise taskmesh.NonRetryableError(f"HTTP {status} from {where}: the receiver refused the delivery")
    raise DeliveryError(f"HTTP {status} from {where}")


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """Read a status line and header block: ``(status, {lower-case name: value})``.

    :raises DeliveryError: the connection closed early or the status line is not HTTP.
    """
    line = await reader.readline()
    fields = line.decode("latin-1").split(None, 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not (fields[1].isdigit() and len(fields[1]) == 3):
        raise DeliveryError(f"malformed HTTP status line: {line[:100]!r}")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n"):
            return int(fields[1]), headers
        if not raw:
            break
        name, _sep, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raise DeliveryError("HTTP header block truncated or too long")
