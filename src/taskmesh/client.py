"""The async Python client: enqueue tasks and read them, with the API's validation."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from taskmesh.errors import InvalidTaskError
from taskmesh.registry import Registry, default_registry
from taskmesh.store import Stores
from taskmesh.tasks import Enqueued, Tasks
from taskmesh.validation import parse_task_spec


class Client:
    """Enqueue and read tasks from application code.

    :param database_url: PostgreSQL URL of the taskmesh database.
    :param redis_url: Redis URL taskmesh dispatches through.
    :param redis_prefix: key prefix, as the instances' ``redis_prefix``.
    :param registry: handlers whose defaults (queue, max_retries) apply when
        known; default the process-wide registry.

    Use as ``async with Client(db, redis) as client: ...``; the pools open on
    entry and close on exit.
    """

    def __init__(
        self,
        database_url: str,
        redis_url: str,
        *,
        redis_prefix: str = "taskmesh",
        registry: Registry | None = None,
        default_max_retries: int = 3,
        pool_size: int = 4,
    ) -> None:
        self._database_url = database_url
        self._redis_url = redis_url
        self._redis_prefix = redis_prefix
        self._registry = registry or default_registry
        self._default_max_retries = default_max_retries
        self._pool_size = pool_size
        self._stores: Stores | None = None
        self._tasks: Tasks | None = None

    async def __aenter__(self) -> Client:
        """Open the stores.

        :raises StoreError: PostgreSQL did not answer or refused.
        """
        self._stores = await Stores.open(
            self._database_url, self._redis_url, redis_prefix=self._redis_prefix, pool_size=self._pool_size
        )
        self._tasks = Tasks(
            self._stores.pg,
            self._stores.redis,
            registry=self._registry,
            default_max_retries=self._default_max_retries,
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._stores is not None:
            await self._stores.close()

    @property
    def tasks(self) -> Tasks:
        """The task facade under the client.

        :raises RuntimeError: used outside ``async with``.
        """
        if self._tasks is None:
            raise RuntimeError("use the client as `async with Client(...) as client:`")
        return self._tasks

    async def enqueue(
        self,
        name: str,
        payload: Any = None,
        *,
        queue: str | None = None,
        priority: int = 0,
        idempotency_key: str | None = None,
        max_retries: int | None = None,
        delay_seconds: float | None = None,
        run_at: datetime | str | None = None,
        tenant_id: str | None = None,
        trace_id: str | None = None,
    ) -> uuid.UUID:
        """Enqueue one task; returns its id (the existing id when ``idempotency_key`` repeats).

        :param payload: any JSON-serialisable value (default ``{}``).
        :param priority: 0..1000, higher runs first.
        :param delay_seconds: run no earlier than this many seconds from now.
        :param run_at: run no earlier than this time (aware datetime or RFC 3339), within 365 days
            of now either way (a past time means now).
        :raises InvalidTaskError: same rules and messages as the HTTP API (an integer beyond 64 bits
            in ``payload`` names its path: ``payload.customer.id``); nothing is written.
        """
        return (
            await self.enqueue_detailed(
                name,
                payload,
                queue=queue,
                priority=priority,
                idempotency_key=idempotency_key,
                max_retries=max_retries,
                delay_seconds=delay_seconds,
                run_at=run_at,
                tenant_id=tenant_id,
                trace_id=trace_id,
            )
        ).task_id

    async def enqueue_detailed(
        self,
        name: str,
        payload: Any = None,
        *,
        queue: str | None = None,
        priority: int = 0,
        idempotency_key: str | None = None,
        max_retries: int | None = None,
        delay_seconds: float | None = None,
        run_at: datetime | str | None = None,
        tenant_id: str | None = None,
        trace_id: str | None = None,
    ) -> Enqueued:
        """As :meth:`enqueue`, returning whether the task was created or deduplicated."""
        data: dict[str, Any] = {"name": name, "priority": priority}
        optional = {
            "payload": payload,
            "queue_name": queue,
            "dedup_key": idempotency_key,
            "max_retries": max_retries,
            "delay_seconds": delay_seconds,
            "run_at": run_at,
            "tenant_id": tenant_id,
            "trace_id": trace_id,
        }
        data.update({k: v for k, v in optional.items() if v is not None})
        return await self.tasks.enqueue(parse_task_spec(data))

    async def enqueue_many(self, tasks: Sequence[Mapping[str, Any]]) -> list[Enqueued]:
        """Enqueue many tasks with one statement and one Redis pipeline.

        :param tasks: mappings in the API's field names (``name``, ``payload``,
            ``queue_name``, ``priority``, ``dedup_key``, ``max_retries``,
            ``delay_seconds``, ``run_at``, ``tenant_id``, ``trace_id``).
        :returns: one :class:`~taskmesh.tasks.Enqueued` per task, in order.
        :raises InvalidTaskError: the first invalid task, its field prefixed with
            ``tasks[i].``; nothing is written then (all or nothing).
        """
        specs = []
        for i, task in enumerate(tasks):
            try:
                specs.append(parse_task_spec(dict(task)))
            except InvalidTaskError as exc:
                raise InvalidTaskError(f"tasks[{i}].{exc.field}", exc.message) from None
        return await self.tasks.enqueue_many(specs)

    async def get(self, task_id: uuid.UUID | str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The task and its latest run, in the API's shape.

        :raises TaskNotFoundError: no task has this id.
        :raises ValueError: ``task_id`` is not a UUID.
        """
        tid = task_id if isinstance(task_id, uuid.UUID) else uuid.UUID(task_id)
        return await self.tasks.get(tid)
