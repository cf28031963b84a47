"""taskmesh: a distributed task platform with durable state in PostgreSQL and dispatch through Redis.

Public API::

    import taskmesh

    @taskmesh.task("reports.export", timeout=120)
    async def export(payload: dict, ctx: taskmesh.TaskContext) -> dict: ...

    async with taskmesh.Client(database_url, redis_url) as client:
        task_id = await client.enqueue("reports.export", {"report": 7})
        result = await client.wait(task_id, timeout=30)

    with taskmesh.SyncClient(database_url, redis_url) as client:  # code that is not async
        result = client.wait(client.enqueue("reports.export", {"report": 7}), timeout=30)

    async with taskmesh.Client(database_url, redis_url) as client:  # a graph of tasks
        answer = await (
            client.workflow("etl")
            .task("extract", "etl.extract")
            .map("transform", "etl.transform", from_="extract")
            .task("load", "etl.load", deps=["transform"])
            .submit()
        )
"""

from __future__ import annotations

import importlib.metadata as _metadata
from typing import TYPE_CHECKING, Any

from taskmesh.errors import (
    ConfigError,
    InvalidTaskError,
    NonRetryableError,
    QuotaExceededError,
    RateLimited,
    Retry,
    StoreError,
    TaskCancelledError,
    TaskFailedError,
    TaskFinishedError,
    TaskmeshError,
    TaskNotFoundError,
    TaskStateError,
    WaitTimeoutError,
    WorkflowNotFoundError,
    WorkflowStateError,
)

try:
    # One source of truth: the package metadata (pyproject.toml's ``version``), as pip installed it.
    __version__ = _metadata.version("taskmesh")
except _metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from taskmesh.clients.client import Client
    from taskmesh.clients.sync_client import SyncClient
    from taskmesh.clients.workflows import WorkflowBuilder
    from taskmesh.limits.book import LimitBook
    from taskmesh.tasks.models import TaskContext
    from taskmesh.tasks.queued_quota import QueuedLimits
    from taskmesh.tasks.registry import Registry, default_registry, task

_LAZY = {
    "Client": "taskmesh.clients.client",
    "SyncClient": "taskmesh.clients.sync_client",
    "WorkflowBuilder": "taskmesh.clients.workflows",
    "TaskContext": "taskmesh.tasks.models",
    "LimitBook": "taskmesh.limits.book",
    "QueuedLimits": "taskmesh.tasks.queued_quota",
    "Registry": "taskmesh.tasks.registry",
    "default_registry": "taskmesh.tasks.registry",
    "task": "taskmesh.tasks.registry",
}
"""Public names imported on first use, so that ``taskmesh``'s command line starts without the
stores' drivers (asyncpg, redis) and pydantic: ``taskmesh.Client`` works as before."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'taskmesh' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Client",
    "ConfigError",
    "InvalidTaskError",
    "LimitBook",
    "NonRetryableError",
    "QueuedLimits",
    "QuotaExceededError",
    "RateLimited",
    "Registry",
    "Retry",
    "StoreError",
    "SyncClient",
    "TaskCancelledError",
    "TaskContext",
    "TaskFailedError",
    "TaskFinishedError",
    "TaskNotFoundError",
    "TaskStateError",
    "TaskmeshError",
    "WaitTimeoutError",
    "WorkflowBuilder",
    "WorkflowNotFoundError",
    "WorkflowStateError",
    "__version__",
    "default_registry",
    "task",
]
