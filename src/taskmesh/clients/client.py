"""The async Python client: enqueue tasks, read them, wait for them, cancel and retry them, with the API's validation.

It submits (one or many at once), reads, lists, cancels and retries workflows too (graphs of tasks), through
the workflow facade; :mod:`taskmesh.clients.workflows` holds their builder.

The client talks to the stores directly (PostgreSQL and Redis), as an instance
does, so it can be used without any instance's HTTP API; :class:`taskmesh.SyncClient`
offers the same methods to code that is not async (Django, Flask, scripts).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import anyio
import asyncpg

from taskmesh.clients.workflows import WorkflowBuilder, WorkflowRef, cancel_reason, list_filters, workflow_ref
from taskmesh.errors import (
    ConfigError,
    InvalidTaskError,
    StoreError,
    TaskCancelledError,
    TaskFailedError,
    WaitTimeoutError,
)
from taskmesh.limits import live
from taskmesh.limits.book import LimitBook
from taskmesh.limits.settings import check_limit, settings_of
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
from taskmesh.workflows.spec import WorkflowLimits, parse_workflow
from taskmesh.workflows.workflows import Workflows

PREFIX_VARIABLE = "TASKMESH_REDIS_PREFIX"
"""The environment variable an instance reads its ``redis_prefix`` from; a client's default too."""
DEFAULT_PREFIX = "taskmesh"


class Client:
    """Enqueue and read tasks from application code, and submit and follow workflows of them.

    :param database_url: PostgreSQL URL of the taskmesh database.
    :param redis_url: Redis URL taskmesh dispatches through.
    :param redis_prefix: key prefix, as the instances' ``redis_prefix``; default the environment's
        ``TASKMESH_REDIS_PREFIX`` (what an instance started in the same environment reads), else
        ``taskmesh``. A client on another prefix than the instances' pushes where none looks.
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
    :param workflow_limits: the bounds of one workflow, as the instances' ``workflow_max_nodes`` and
        ``workflow_map_max_items`` (default their defaults).
    :param limits: the task limits, fair shares and priority aging the instances are configured with
        (``LimitBook.of_settings(load_settings())``), so that this client's creates hold the same limit
        keys; limits set at run time are read from PostgreSQL either way. Default: those only.

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
        redis_prefix: str | None = None,
        registry: Registry | None = None,
        default_max_retries: int = 3,
        pool_size: int = 4,
        pg_pooler: str = "none",
        redis_mode: RedisMode = "standalone",
        max_delay_seconds: float = MAX_DELAY_SECONDS,
        queued_limits: QueuedLimits | None = None,
        workflow_limits: WorkflowLimits | None = None,
        limits: LimitBook | None = None,
    ) -> None:
        _check_redis_options(redis_url, redis_mode)
        self._database_url = database_url
        self._redis_url = redis_url
        self._redis_prefix = redis_prefix or os.environ.get(PREFIX_VARIABLE) or DEFAULT_PREFIX
        self._registry = registry or default_registry
        self._default_max_retries = default_max_retries
        self._pool_size = pool_size
        self._pg_pooler = pg_pooler
        self._redis_mode: RedisMode = redis_mode
        self._max_delay_seconds = max_delay_seconds
        self._queued_limits = queued_limits
        self._workflow_limits = workflow_limits
        self._limits = limits
        self._stores: Stores | None = None
        self._tasks: Tasks | None = None
        self._workflows: Workflows | None = None

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
            limits=self._limits,
        )
        self._workflows = Workflows(self._tasks, self._workflow_limits)
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

    @property
    def workflows(self) -> Workflows:
        """The workflow facade under the client.

        :raises RuntimeError: used outside ``async with``.
        """
        if self._workflows is None:
            raise RuntimeError("use the client as `async with Client(...) as client:`")
        return self._workflows

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
        concurrency_key: str | None = None,
        debounce: Mapping[str, Any] | None = None,
        throttle: Mapping[str, Any] | None = None,
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
        :param concurrency_key: ``<limit>`` or ``<limit>:<value>``: a counter of a limit in force it also holds.
        :param debounce: ``{"key", "seconds", "max_wait"}``: the last create of the key within the window runs.
        :param throttle: ``{"key", "seconds"}``: at most one task of the key per window; the others answer it.
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
                concurrency_key=concurrency_key,
                debounce=debounce,
                throttle=throttle,
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
        concurrency_key: str | None = None,
        debounce: Mapping[str, Any] | None = None,
        throttle: Mapping[str, Any] | None = None,
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
            "concurrency_key": concurrency_key,
            "debounce": debounce,
            "throttle": throttle,
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

    def workflow(
        self,
        name: str,
        *,
        dedup_key: str | None = None,
        tenant_id: str | None = None,
        queue_name: str | None = None,
        context: Any = None,
        trace_id: str | None = None,
    ) -> WorkflowBuilder[Coroutine[Any, Any, dict[str, Any]]]:
        """A workflow to build node by node, then ``await builder.submit()``; see :class:`WorkflowBuilder`
        for the options and what it refuses."""
        return WorkflowBuilder(
            name,
            self.submit_workflow,
            dedup_key=dedup_key,
            tenant_id=tenant_id,
            queue_name=queue_name,
            context=context,
            trace_id=trace_id,
        )

    async def submit_workflow(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Submit a workflow given as the body of ``POST /api/v1/workflows`` (as :meth:`WorkflowBuilder.to_json` makes).

        :returns: the API's answer: ``{"workflow_id", "status", "trace_id", "nodes": {node id: task id,
            or a map node's list}}``, with ``"deduplicated": True`` (and no nodes) when ``dedup_key`` repeats.
        :raises InvalidTaskError: as the API's 422, naming the field (``nodes[2].deps``); nothing is written.
        """
        spec = parse_workflow(dict(body), self.workflows.limits)
        return (await self.workflows.submit(spec)).to_dict()

    async def submit_workflows(self, bodies: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Submit many workflows in one transaction of a few statements (as ``POST /api/v1/workflows:batch``
        stores them), then push all their roots: 5,000 small workflows cost a few transactions, not
        5,000. Each body is that of ``POST /api/v1/workflows`` (``builder.to_json()`` of a
        :meth:`workflow` builder makes one).

        :returns: one answer per body, in order, as :meth:`submit_workflow` answers; a body whose
            ``dedup_key`` is taken, or repeats an earlier body's, answers that workflow with
            ``"deduplicated": True`` and stores nothing.
        :raises InvalidTaskError: the first refused body, its field under ``workflows[i].``
            (``workflows[3].nodes[0].deps``); nothing is written then (all or nothing).
        """
        specs = []
        for i, body in enumerate(bodies):
            try:
                specs.append(parse_workflow(dict(body), self.workflows.limits))
            except InvalidTaskError as exc:
                raise exc.under(f"workflows[{i}].") from None
        return [s.to_dict() for s in await self.workflows.submit_many(specs)]

    async def set_limit(self, name: str, **settings: Any) -> None:
        """Set a task limit at run time, as ``PUT /api/v1/limits/{name}`` does: ``queue``, ``task``, ``key``,
        ``concurrency``, ``rate``, ``burst`` (``limits/settings.py``). Every instance holds it within a second.

        :raises InvalidTaskError: a bad name or setting, naming it; nothing is set.
        """
        await live.set_limit(self.tasks.limits, self.tasks.pg, check_limit(name), settings_of(settings), None)

    async def unset_limit(self, name: str) -> bool:
        """Drop a limit set at run time (the configured one of its name, if any, holds again); returns whether
        one was set."""
        return await live.unset_limit(self.tasks.limits, self.tasks.pg, name)

    async def limits(self) -> dict[str, dict[str, Any]]:
        """The limits in force (configured for this client, or set at run time), by name, as settings."""
        await live.read(self.tasks.limits, self.tasks.pg)
        return {name: s.model_dump() for name, s in sorted(self.tasks.limits.limits.items())}

    async def get_workflow(self, workflow_id: WorkflowRef) -> dict[str, Any]:
        """The workflow, its tasks counted by status, and its nodes, in the API's shape.

        :param workflow_id: its id (a UUID or its text), or what ``submit()`` answered.
        :raises WorkflowNotFoundError: no workflow has this id.
        :raises InvalidTaskError: ``workflow_id`` is not a UUID.
        """
        return await self.workflows.get(workflow_ref(workflow_id))

    async def list_workflows(
        self,
        *,
        name: str | None = None,
        status: str | None = None,
        tenant_id: str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """A page of workflows, newest first: ``{"workflows": [...], "next_cursor": str | None}``.

        :param status: ``running``, ``completed``, ``failed`` or ``cancelled``.
        :param created_after: created at or after (an aware datetime or RFC 3339 text); ``created_before``: before.
        :param limit: 1..500 per page.
        :param cursor: the ``next_cursor`` of the page before.
        :raises InvalidTaskError: a bad status, time, limit or cursor, as the API's 422.
        """
        filters = list_filters(name, status, tenant_id, created_after, created_before)
        return await self.workflows.page(**filters, cursor=cursor, limit=limit)

    async def cancel_workflow(self, workflow_id: WorkflowRef, reason: str | None = None) -> dict[str, Any]:
        """Cancel a workflow: its tasks not started end cancelled, its running ones are stopped (as the API's cancel).

        :param reason: why (at most 500 characters), kept with the workflow.
        :returns: ``{"workflow_id", "status": "cancelled", "cancelled": tasks ended now,
            "cancel_requested": running tasks asked to stop}``; a cancelled workflow answers again.
        :raises WorkflowNotFoundError: no workflow has this id.
        :raises WorkflowStateError: it is completed or failed.
        :raises InvalidTaskError: ``reason`` longer than 500 characters or holding a NUL.
        """
        return await self.workflows.cancel(workflow_ref(workflow_id), cancel_reason(reason))

    async def retry_workflow(self, workflow_id: WorkflowRef) -> dict[str, Any]:
        """Run a failed or cancelled workflow again from where it failed (as the API's retry): its failed,
        cancelled and skipped tasks wait again for their deps with a fresh retry budget.

        :returns: ``{"workflow_id", "status": "running", "requeued": n, "reblocked": m}``.
        :raises WorkflowNotFoundError: no workflow has this id.
        :raises WorkflowStateError: it is running, completed, or cancelled with tasks still running.
        """
        return await self.workflows.retry(workflow_ref(workflow_id))


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
