"""The async Python client: enqueue tasks, read them, wait for them, cancel and retry them, with the API's validation.

The client talks to the stores directly (PostgreSQL and Redis), as an instance
does, so it can be used without any instance's HTTP API; :class:`taskmesh.SyncClient`
offers the same methods to code that is not async (Django, Flask, scripts).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import anyio
import asyncpg

from taskmesh.errors import (
    ConfigError,
    InvalidTaskError,
    StoreError,
    TaskCancelledError,
    TaskFailedError,
    WaitTimeoutError,
)
from taskmesh.store import Stores
from taskmesh.store.redis_types import RedisMode
from taskmesh.store.redis_urls import check_redis_url, cluster_url_problem
from taskmesh.tasks.actions import Cancelled, Retried
from taskmesh.tasks.models import Enqueued
from taskmesh.tasks.queued_quota import QueuedLimits
from taskmesh.tasks.registry import Registry, default_registry
from taskmesh.tasks.states import TaskStatus
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import MAX_DELAY_SECONDS, parse_task_spec


class Client:
    """Enqueue and read tasks from application code.

    :param database_url: PostgreSQL URL of the taskmesh database.
    :param redis_url: Redis URL taskmesh dispatches through.
    :param redis_prefix: key prefix, as the instances' ``redis_prefix``.
    :param registry: handlers whose defaults (queue, max_retries) apply when
        known; default the process-wide registry.
    :param pg_pooler: ``transaction`` when ``database_url`` is PgBouncer in transaction mode,
        as the instances' ``pg_pooler``.
    :param redis_mode: ``cluster`` when ``redis_url`` names a Redis Cluster node, as the
        instances' ``redis_mode`` (a ``redis+sentinel://`` URL needs nothing more).
    :param max_delay_seconds: how far ahead a task may be delayed, as the instances'
        ``max_delay_seconds`` (default one year); any past ``run_at`` means now.
    :param queued_limits: tenants' ``max_queued`` quotas to hold on this client's creates too,
        exactly as the instances do (``QueuedLimits.of_settings(load_settings())``); default none:
        the application's own creates are not counted against them.

    Use as ``async with Client(db, redis) as client: ...``; the pools open on
    entry and close on exit.

    :raises ConfigError: ``redis_url`` or ``redis_mode`` is one an instance's settings refuse
        (a Redis Cluster URL with a database other than 0, a database number that is not a
        number, an unknown mode...), in the words of ``load_settings``; nothing connects.
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
        pg_pooler: str = "none",
        redis_mode: RedisMode = "standalone",
        max_delay_seconds: float = MAX_DELAY_SECONDS,
        queued_limits: QueuedLimits | None = None,
    ) -> None:
        _check_redis_options(redis_url, redis_mode)
        self._database_url = database_url
        self._redis_url = redis_url
        self._redis_prefix = redis_prefix
        self._registry = registry or default_registry
        self._default_max_retries = default_max_retries
        self._pool_size = pool_size
        self._pg_pooler = pg_pooler
        self._redis_mode: RedisMode = redis_mode
        self._max_delay_seconds = max_delay_seconds
        self._queued_limits = queued_limits
        self._stores: Stores | None = None
        self._tasks: Tasks | None = None

    async def __aenter__(self) -> Client:
        """Open the stores, and check that Redis is one this client can use as configured.

        :raises StoreError: PostgreSQL did not answer or refused; or Redis refused for good (a
            password, TLS, a cluster node with ``redis_mode="standalone"`` or the reverse, an
            unknown Sentinel master: the message names ``redis_url``). A Redis that does not
            answer is no error here: creates commit in PostgreSQL, and the instances push them.
        """
        self._stores = await Stores.open(
            self._database_url,
            self._redis_url,
            redis_prefix=self._redis_prefix,
            pool_size=self._pool_size,
            pooler=self._pg_pooler,
            redis_mode=self._redis_mode,
        )
        try:
            await self._stores.redis.check_server()
        except StoreError as exc:
            if not exc.transient:
                await self._stores.close()
                self._stores = None
                raise
        self._tasks = Tasks(
            self._stores.pg,
            self._stores.redis,
            registry=self._registry,
            default_max_retries=self._default_max_retries,
            max_delay_seconds=self._max_delay_seconds,
            queued_limits=self._queued_limits,
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
        connection: asyncpg.Connection | None = None,
    ) -> uuid.UUID:
        """Enqueue one task; returns its id (the existing id when ``idempotency_key`` repeats).

        :param payload: any JSON-serialisable value (default ``{}``).
        :param priority: 0..1000, higher runs first.
        :param delay_seconds: run no earlier than this many seconds from now.
        :param run_at: run no earlier than this time (aware datetime or RFC 3339), at most
            ``max_delay_seconds`` ahead; any past time means now.
        :param connection: the application's own asyncpg connection, inside a transaction: the
            task is stored in that transaction (rolled back, it never existed; committed, an
            instance pushes it within a second, with no further call). See :meth:`enqueue_many`.
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
                connection=connection,
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
        connection: asyncpg.Connection | None = None,
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
        spec = parse_task_spec(data, max_delay_seconds=self.tasks.max_delay_seconds)
        if connection is not None:
            [enqueued] = await self.tasks.enqueue_in_transaction(connection, [spec])
            return enqueued
        return await self.tasks.enqueue(spec)

    async def enqueue_many(
        self, tasks: Sequence[Mapping[str, Any]], *, connection: asyncpg.Connection | None = None
    ) -> list[Enqueued]:
        """Enqueue many tasks in one transaction (one INSERT, or COPY for 64 or more immediate tasks), then push them.

        With ``connection`` (the application's asyncpg connection, inside a transaction), the
        tasks are stored in that transaction and nothing is pushed: PostgreSQL tells the
        instances at commit (``taskmesh_enqueued``) and one of them pushes the tasks within a
        second; after a rollback they never existed (transactional enqueue, as in River or Oban).

        :param tasks: mappings in the API's field names (``name``, ``payload``,
            ``queue_name``, ``priority``, ``dedup_key``, ``max_retries``,
            ``delay_seconds``, ``run_at``, ``tenant_id``, ``trace_id``).
        :returns: one :class:`~taskmesh.tasks.models.Enqueued` per task, in order.
        :raises InvalidTaskError: the first invalid task, its field prefixed with
            ``tasks[i].``; nothing is written then (all or nothing).
        """
        # Only read, never changed: a dict goes as it is (a copy per task fed the garbage collector).
        items = [task if type(task) is dict else dict(task) for task in tasks]
        if connection is not None:
            return await self.tasks.enqueue_in_transaction(connection, self.tasks.parse(items))
        return await self.tasks.enqueue_mappings(items)

    async def get(self, task_id: TaskRef) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The task and its latest run, in the API's shape.

        :param task_id: its id (a UUID or its text), or what :meth:`enqueue_detailed` or
            :meth:`enqueue_many` returned for it.
        :raises TaskNotFoundError: no task has this id.
        :raises InvalidTaskError: ``task_id`` is not a UUID.
        """
        return await self.tasks.get(task_ref(task_id))

    async def runs(self, task_id: TaskRef) -> list[dict[str, Any]]:
        """Every run of the task, by attempt, with its error and traceback.

        :raises TaskNotFoundError: no task has this id.
        :raises InvalidTaskError: ``task_id`` is not a UUID.
        """
        return await self.tasks.runs(task_ref(task_id))

    async def cancel(self, task_id: TaskRef) -> Cancelled:
        """Cancel a task: a queued one at once, a running one on its worker (as the API's cancel).

        :raises TaskNotFoundError: no task has this id.
        :raises TaskFinishedError: it finished already.
        """
        return await self.tasks.cancel(task_ref(task_id))

    async def retry(self, task_id: TaskRef, *, priority: int | None = None, queue: str | None = None) -> Retried:
        """Queue a failed or cancelled task again with a fresh retry budget (as the API's retry).

        :raises TaskNotFoundError: no task has this id.
        :raises TaskStateError: it is queued, running or completed.
        """
        return await self.tasks.retry(task_ref(task_id), priority, queue)

    async def wait(self, task_id: TaskRef, timeout: float = 60.0) -> Any:  # noqa: ASYNC109  # the issue's signature
        """Wait until the task finishes; returns its result (the handler's return value, decoded).

        The end is heard on the instances' finished-tasks channel (``store/finished.py``),
        not by reading the task in a loop; while Redis does not answer, the task is read
        once a second.

        :param timeout: seconds to wait at most.
        :raises TaskFailedError: it ended failed (dead-lettered); ``error`` is its last run's.
        :raises TaskCancelledError: it was cancelled.
        :raises WaitTimeoutError: it did not finish within ``timeout`` (a ``TimeoutError``).
        :raises TaskNotFoundError: no task has this id.
        """
        tid = task_ref(task_id)
        deadline = anyio.current_time() + timeout
        finished = self.tasks.redis.finished
        while True:
            try:
                async with finished.subscribe() as subscription:
                    await finished.mark_waiting(timeout)
                    while True:
                        result = await self._ended(tid, deadline, timeout)
                        if result is not _RUNNING:
                            return result
                        while (left := deadline - anyio.current_time()) > 0:  # read again when told, or at the end
                            ids = await subscription.receive(min(1.0, left))
                            if ids is not None and str(tid) in ids:
                                break
            except StoreError:  # Redis: read the task once a second until the deadline
                result = await self._ended(tid, deadline, timeout)
                if result is not _RUNNING:
                    return result
                await anyio.sleep(min(1.0, max(0.0, deadline - anyio.current_time())))

    async def _ended(self, tid: uuid.UUID, deadline: float, waited: float) -> Any:
        """The task's result once it completed; :data:`_RUNNING` while it may still end before ``deadline``.

        :raises TaskFailedError, TaskCancelledError, WaitTimeoutError: as :meth:`wait`.
        """
        task, run = await self.tasks.get(tid)
        status = task["status"]
        if status == TaskStatus.COMPLETED:
            return run["result"] if run is not None else None
        if status == TaskStatus.FAILED:
            raise TaskFailedError(str(tid), run["error"] if run is not None else None)
        if status == TaskStatus.CANCELLED:
            raise TaskCancelledError(str(tid))
        if anyio.current_time() >= deadline:
            raise WaitTimeoutError(str(tid), waited, status)
        return _RUNNING


TaskRef = uuid.UUID | str | Enqueued
"""A task as the client's methods take it: its id, its id as text, or an enqueue's answer."""

_RUNNING = object()
"""What :meth:`Client._ended` returns while the task has not finished."""


def task_ref(ref: TaskRef) -> uuid.UUID:
    """The task id of ``ref``.

    :raises InvalidTaskError: text that is not a UUID (``task_id: must be a UUID``).
    """
    if isinstance(ref, Enqueued):
        return ref.task_id
    if isinstance(ref, uuid.UUID):
        return ref
    try:
        return uuid.UUID(str(ref))
    except ValueError:
        raise InvalidTaskError("task_id", "must be a UUID") from None


def _check_redis_options(redis_url: str, redis_mode: str) -> None:
    """The checks ``config.Settings`` makes of ``redis_url`` and ``redis_mode``, with its messages.

    :raises ConfigError: ``redis_url: ...`` or ``redis_mode: ...`` (both when both are wrong).
    """
    problems: list[str] = []
    try:
        check_redis_url(redis_url)
    except ValueError as exc:
        problems.append(f"redis_url: {exc}")
    if redis_mode not in ("standalone", "cluster"):
        problems.append("redis_mode: Input should be 'standalone' or 'cluster'")
    elif redis_mode == "cluster" and not problems:
        problem = cluster_url_problem(redis_url)
        if problem:
            problems.append(f"redis_mode: {problem}")
    if problems:
        raise ConfigError("; ".join(problems))
