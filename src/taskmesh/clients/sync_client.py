"""The Python client for code that is not async (Django, Flask, scripts): :class:`SyncClient`.

It offers the methods of :class:`taskmesh.Client` as plain calls. The async client
runs on an event loop in a thread of the SyncClient's own (anyio's blocking
portal), started by :meth:`SyncClient.open` (or ``with``) and stopped by
:meth:`SyncClient.close`; calls from several threads are served one after another
on that loop, each waiting for its answer.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from taskmesh.clients.client import Client, TaskRef
from taskmesh.clients.workflows import WorkflowBuilder, WorkflowRef
from taskmesh.tasks.actions import Cancelled, Retried
from taskmesh.tasks.models import Enqueued

P = ParamSpec("P")
T = TypeVar("T")


class SyncClient:
    """Enqueue, read, wait for, cancel and retry tasks, and submit and follow workflows, from code that is not async.

    Takes the arguments of :class:`taskmesh.Client`. Use as ``with SyncClient(db, redis) as
    client: ...``, or call :meth:`open` once and :meth:`close` at exit. Every method raises
    what the :class:`~taskmesh.Client` method of the same name raises.
    """

    def __init__(self, database_url: str, redis_url: str, **options: Any) -> None:
        self._client = Client(database_url, redis_url, **options)
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None

    def open(self) -> SyncClient:
        """Start the client's event loop thread and open the stores.

        :raises StoreError: PostgreSQL or Redis did not answer or refused (nothing stays open).
        """
        if self._portal is not None:
            return self
        cm = start_blocking_portal()
        portal = cm.__enter__()
        try:
            portal.call(self._client.__aenter__)
        except BaseException as exc:
            cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._portal_cm, self._portal = cm, portal
        return self

    def close(self) -> None:
        """Close the stores and stop the thread (a second call does nothing)."""
        if self._portal is None or self._portal_cm is None:
            return
        portal, cm = self._portal, self._portal_cm
        self._portal = self._portal_cm = None
        try:
            portal.call(self._client.__aexit__, None, None, None)
        finally:
            cm.__exit__(None, None, None)

    def __enter__(self) -> SyncClient:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, func: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._portal is None:
            raise RuntimeError("open the client first: `with SyncClient(...) as client:` or `client.open()`")
        return self._portal.call(functools.partial(func, *args, **kwargs))

    def enqueue(self, name: str, payload: Any = None, **options: Any) -> uuid.UUID:
        """As :meth:`taskmesh.Client.enqueue` (same keyword options): the task's id."""
        return self._call(self._client.enqueue, name, payload, **options)

    def enqueue_detailed(self, name: str, payload: Any = None, **options: Any) -> Enqueued:
        """As :meth:`taskmesh.Client.enqueue_detailed`."""
        return self._call(self._client.enqueue_detailed, name, payload, **options)

    def enqueue_many(self, tasks: Sequence[Mapping[str, Any]]) -> list[Enqueued]:
        """As :meth:`taskmesh.Client.enqueue_many` (each answer is accepted by :meth:`get` and :meth:`wait`)."""
        return self._call(self._client.enqueue_many, tasks)

    def get(self, task_id: TaskRef) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """As :meth:`taskmesh.Client.get`: the task and its latest run."""
        return self._call(self._client.get, task_id)

    def runs(self, task_id: TaskRef) -> list[dict[str, Any]]:
        """As :meth:`taskmesh.Client.runs`."""
        return self._call(self._client.runs, task_id)

    def cancel(self, task_id: TaskRef) -> Cancelled:
        """As :meth:`taskmesh.Client.cancel`."""
        return self._call(self._client.cancel, task_id)

    def retry(self, task_id: TaskRef, *, priority: int | None = None, queue: str | None = None) -> Retried:
        """As :meth:`taskmesh.Client.retry`."""
        return self._call(self._client.retry, task_id, priority=priority, queue=queue)

    def wait(self, task_id: TaskRef, timeout: float = 60.0) -> Any:
        """As :meth:`taskmesh.Client.wait`: the task's result once it finished.

        :raises TaskFailedError: the task failed, as the async client.
        :raises TaskCancelledError: the task was cancelled.
        :raises WaitTimeoutError: it did not finish within ``timeout``.
        """
        return self._call(self._client.wait, task_id, timeout)

    def workflow(self, name: str, **options: Any) -> WorkflowBuilder[dict[str, Any]]:
        """As :meth:`taskmesh.Client.workflow` (same keyword options); its ``submit()`` blocks for the answer."""
        # The builder is made here, not on the loop: only its submit crosses to the client's thread.
        return WorkflowBuilder(name, self.submit_workflow, **options)

    def submit_workflow(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """As :meth:`taskmesh.Client.submit_workflow`."""
        return self._call(self._client.submit_workflow, body)

    def submit_workflows(self, bodies: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """As :meth:`taskmesh.Client.submit_workflows`: many workflows in one transaction."""
        return self._call(self._client.submit_workflows, bodies)

    def get_workflow(self, workflow_id: WorkflowRef) -> dict[str, Any]:
        """As :meth:`taskmesh.Client.get_workflow`."""
        return self._call(self._client.get_workflow, workflow_id)

    def list_workflows(self, **filters: Any) -> dict[str, Any]:
        """As :meth:`taskmesh.Client.list_workflows` (same keyword filters, ``limit`` and ``cursor``)."""
        return self._call(self._client.list_workflows, **filters)

    def cancel_workflow(self, workflow_id: WorkflowRef, reason: str | None = None) -> dict[str, Any]:
        """As :meth:`taskmesh.Client.cancel_workflow`."""
        return self._call(self._client.cancel_workflow, workflow_id, reason)

    def retry_workflow(self, workflow_id: WorkflowRef) -> dict[str, Any]:
        """As :meth:`taskmesh.Client.retry_workflow`."""
        return self._call(self._client.retry_workflow, workflow_id)
