"""taskmesh: a distributed task platform with durable state in PostgreSQL and dispatch through Redis.

Public API::

    import taskmesh

    @taskmesh.task("reports.export", timeout=120)
    async def export(payload: dict, ctx: taskmesh.TaskContext) -> dict: ...

    async with taskmesh.Client(database_url, redis_url) as client:
        task_id = await client.enqueue("reports.export", {"report": 7})
"""

from __future__ import annotations

__version__ = "0.1.0"

from taskmesh.client import Client
from taskmesh.errors import (
    ConfigError,
    InvalidTaskError,
    NonRetryableError,
    Retry,
    StoreError,
    TaskmeshError,
    TaskNotFoundError,
)
from taskmesh.models import TaskContext
from taskmesh.registry import Registry, default_registry, task

__all__ = [
    "Client",
    "ConfigError",
    "InvalidTaskError",
    "NonRetryableError",
    "Registry",
    "Retry",
    "StoreError",
    "TaskContext",
    "TaskNotFoundError",
    "TaskmeshError",
    "__version__",
    "default_registry",
    "task",
]
