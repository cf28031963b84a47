"""Rows of the stores in the API's shape (the original platform's field names: queue_name, dedup_key).

Pure decoding, no I/O. A value PostgreSQL returns that taskmesh did not write
(an infinite timestamp, a number orjson cannot read) is rendered as well as it
can be, never raised: reading a task must not fail because of what is in it.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import orjson


def iso(value: datetime | None) -> str | None:
    """An instant as ISO 8601 text (``None`` stays ``None``).

    PostgreSQL's ``-infinity`` and ``infinity`` (which asyncpg reads as naive ``datetime.min``
    and ``datetime.max``; every finite ``timestamptz`` comes aware) are rendered as such.
    """
    if value is None:
        return None
    if value.tzinfo is None and value in (datetime.min, datetime.max):
        return "-infinity" if value == datetime.min else "infinity"
    return value.isoformat()


def json_value(text: str | None) -> Any:
    """Decode a jsonb column read as text; ``None`` stays ``None``.

    orjson first; what it refuses (integers beyond 64 bits written by hand, say)
    is read by the standard library, which keeps them exact.
    """
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def task_to_dict(row: Any, *, payload: bool = True) -> dict[str, Any]:
    """A ``tasks`` row (or a joined row with its columns) in the API's shape.

    :param payload: include ``payload`` (the row then has the column); lists leave it out.
    """
    out = {
        "id": str(row["id"]),
        "name": row["name"],
        "type": row["type"],
        "queue_name": row["queue"],
        "priority": row["priority"],
        "payload": json_value(row["payload"]) if payload else None,
        "dedup_key": row["idempotency_key"],
        "max_retries": row["max_retries"],
        "retries": row["retries"],
        "attempts": row["attempts"],
        "status": row["status"],
        "run_at": iso(row["run_at"]),
        "tenant_id": row["tenant_id"],
        "trace_id": row["trace_id"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
    }
    if not payload:
        del out["payload"]
    return out


def task_summary_to_dict(row: Any) -> dict[str, Any]:
    """A task as lists show it (the DLQ listing, the search): without its payload, with its latest run.

    :param row: the task's columns but ``payload``, and ``run_attempt``, ``run_status``,
        ``run_error``, ``run_finished_at`` of its latest run.

    :returns: the task's fields but ``payload``, plus ``latest_run``: ``{"attempt", "status",
        "error", "finished_at"}`` (``None`` for a task without a run, which taskmesh never writes).
    """
    out = task_to_dict(row, payload=False)
    out["latest_run"] = (
        {
            "attempt": row["run_attempt"],
            "status": row["run_status"],
            "error": row["run_error"],
            "finished_at": iso(row["run_finished_at"]),
        }
        if row["run_attempt"] is not None
        else None
    )
    return out


_RUN_COLUMNS = (
    "id",
    "task_id",
    "attempt",
    "status",
    "worker_id",
    "claimed_at",
    "started_at",
    "finished_at",
    "lease_expires_at",
    "next_retry_at",
    "error",
    "result",
    "created_at",
    "updated_at",
)


def run_to_dict(row: Any, prefix: str = "") -> dict[str, Any]:
    """A ``task_runs`` row in the API's shape.

    :param prefix: column prefix in a joined row (``run_``); the task id then comes from ``id``.
    """
    values = {c: row[prefix + c] for c in _RUN_COLUMNS if not (prefix and c == "task_id")}
    if prefix:
        values["task_id"] = row["id"]
    out: dict[str, Any] = {
        "id": str(values["id"]),
        "task_id": str(values["task_id"]),
        "attempt": values["attempt"],
        "status": values["status"],
        "worker_id": values["worker_id"],
        "claimed_at": iso(values["claimed_at"]),
        "started_at": iso(values["started_at"]),
        "finished_at": iso(values["finished_at"]),
        "lease_expires_at": iso(values["lease_expires_at"]),
        "next_retry_at": iso(values["next_retry_at"]),
        "error": values["error"],
        "result": json_value(values["result"]),
        "created_at": iso(values["created_at"]),
        "updated_at": iso(values["updated_at"]),
    }
    if not prefix and "traceback" in row.keys():  # asyncpg records have keys(), not __contains__ of names
        out["traceback"] = row["traceback"]
    return out


def task_and_latest_run(row: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Split a ``task_get_with_latest_run`` row into the task and its latest run (``None``: no run yet).

    The task says which workflow it is a node of: ``workflow_id``, ``workflow_node`` and ``map_index``
    (null for a task of its own).
    """
    task = task_to_dict(row)
    task["workflow_id"] = str(row["workflow_id"]) if row["workflow_id"] is not None else None
    task["workflow_node"], task["map_index"] = row["workflow_node"], row["map_index"]
    return task, (run_to_dict(row, prefix="run_") if row["run_id"] is not None else None)


def pause_to_dict(queue: str, row: Any) -> dict[str, Any]:
    """A queue's pause state in the API's shape: ``{"queue", "paused", "paused_at", "reason"}``.

    :param row: a ``queues`` row (``name, paused_at, paused_reason``), or ``None`` for a queue
        never paused (running).
    """
    paused_at = row["paused_at"] if row is not None else None
    return {
        "queue": queue,
        "paused": paused_at is not None,
        "paused_at": iso(paused_at),
        "reason": row["paused_reason"] if paused_at is not None else None,
    }
