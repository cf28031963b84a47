"""The Python clients: a script that is not async enqueues and waits; every end has its exception.

``taskmesh.SyncClient`` offers the async client's methods as plain calls;
``wait`` returns the result or raises ``TaskFailedError`` / ``TaskCancelledError``
/ ``WaitTimeoutError``; the answers of ``enqueue_many`` are accepted by ``get``
and ``wait``; only taskmesh's own exceptions come out.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

import taskmesh
from taskmesh.clients.client import Client
from taskmesh.errors import InvalidTaskError, NonRetryableError
from taskmesh.tasks.registry import Registry
from tests.proc import free_port

pytestmark = pytest.mark.anyio


def register(registry: Registry) -> None:
    @registry.task("client.add")
    async def add(payload: dict[str, int]) -> int:
        await anyio.sleep(0.2)
        return payload["a"] + payload["b"]

    @registry.task("client.broken", max_retries=0)
    async def broken(payload: Any) -> None:
        raise NonRetryableError("the printer is on fire")


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import taskmesh

    database_url, redis_url, prefix = sys.argv[1:4]
    with taskmesh.SyncClient(database_url, redis_url, redis_prefix=prefix) as client:
        task_id = client.enqueue("client.add", {"a": 2, "b": 40})
        result = client.wait(task_id, timeout=30)
        many = client.enqueue_many([{"name": "client.add", "payload": {"a": 1, "b": 1}}])
        again = client.wait(many[0], timeout=30)
        task, run = client.get(many[0])
    print(json.dumps({"result": result, "again": again, "status": task["status"], "attempt": run["attempt"]}))
    """
)


async def test_a_plain_script_enqueues_and_waits_for_results_with_the_sync_client(
    start_instance: Any, registry: Registry, database_url: str, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    register(registry)
    script = tmp_path / "enqueue_and_wait.py"
    script.write_text(SCRIPT)
    async with start_instance():
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, str(script), database_url, redis_url, prefix],
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"result": 42, "again": 2, "status": "completed", "attempt": 1}


async def test_wait_raises_for_a_failed_a_cancelled_and_a_late_task(
    start_instance: Any, registry: Registry, database_url: str, redis_url: str, prefix: str
) -> None:
    register(registry)
    async with (
        start_instance(),
        Client(database_url, redis_url, redis_prefix=prefix, registry=registry) as client,
    ):
        broken = await client.enqueue("client.broken")
        with pytest.raises(taskmesh.TaskFailedError) as failed:
            await client.wait(broken, timeout=30)
        assert (failed.value.task_id, failed.value.error) == (str(broken), "NonRetryableError: the printer is on fire")
        later = await client.enqueue("client.add", {"a": 1, "b": 2}, delay_seconds=3600)
        t0 = time.monotonic()
        with pytest.raises(taskmesh.WaitTimeoutError) as late:
            await client.wait(later, timeout=1)
        assert time.monotonic() - t0 >= 1 and isinstance(late.value, TimeoutError)
        assert str(late.value) == f"task {later} is still queued after 1 s"
        await client.cancel(later)
        with pytest.raises(taskmesh.TaskCancelledError) as cancelled:
            await client.wait(later, timeout=5)
        assert (str(cancelled.value), cancelled.value.task_id) == (f"task {later} was cancelled", str(later))
        with pytest.raises(InvalidTaskError) as bad:
            await client.get("not-a-uuid")
        assert (bad.value.field, bad.value.message) == ("task_id", "must be a UUID")


async def test_the_sync_client_waits_in_a_thread_while_the_instance_runs_the_task(
    start_instance: Any, registry: Registry, database_url: str, redis_url: str, prefix: str
) -> None:
    register(registry)

    def script() -> tuple[Any, Any, int]:
        with taskmesh.SyncClient(database_url, redis_url, redis_prefix=prefix, registry=registry) as client:
            t0 = time.monotonic()
            result = client.wait(client.enqueue("client.add", {"a": 20, "b": 22}), timeout=30)
            assert time.monotonic() - t0 < 15  # woken by the end's announcement, not at the deadline
            later = client.enqueue("client.add", {"a": 1, "b": 2}, delay_seconds=3600)
            client.cancel(later)
            retried = client.retry(later, priority=3)
            return result, client.wait(later, timeout=30), retried.priority

    async with start_instance():
        assert await anyio.to_thread.run_sync(script) == (42, 3, 3)


QUIET_SCRIPT = textwrap.dedent(
    """
    import sys
    import taskmesh

    database_url, redis_url, prefix = sys.argv[1:4]
    with taskmesh.SyncClient(database_url, redis_url, redis_prefix=prefix) as client:
        task_id = client.enqueue("client.add", {"a": 1, "b": 1}, delay_seconds=3600)
        client.cancel(task_id)
        client.retry(task_id)
        client.cancel(task_id)
    print("the script's own line")
    """
)


async def test_the_client_prints_nothing_into_a_script_and_its_warnings_reach_logging(
    database_url: str, redis_url: str, prefix: str, tmp_path: Path, pool: asyncpg.Pool
) -> None:
    script = tmp_path / "quiet.py"
    script.write_text(QUIET_SCRIPT)

    def run(redis: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), database_url, redis, prefix], capture_output=True, text=True, timeout=60
        )

    # Retries and deletes are logged at info by an instance: a script sees none of it, while a live
    # instance has the task's handler (else the client warns that the name is unadvertised).
    await pool.execute(
        "INSERT INTO workers (id, host, pid, queues, version, state, handlers, handler_options)"
        " VALUES ('w-quiet', 'h', 1, '{}', 'v', 'running', ARRAY['client.add'], $1::jsonb)",
        '{"client.add": {"queue": null, "max_retries": null, "payload_schema": null}}',
    )
    try:
        quiet = await anyio.to_thread.run_sync(run, redis_url)
        assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "the script's own line\n", "")
        # A Redis that is down is a warning (the tasks are in PostgreSQL; an instance pushes them later):
        # it reaches the standard library's logging, which prints warnings on stderr unless told otherwise.
        down = await anyio.to_thread.run_sync(run, f"redis://127.0.0.1:{free_port()}/0")
        assert (down.returncode, down.stdout) == (0, "the script's own line\n"), down.stderr[-2000:]
        pushed = "event='redis_push_failed' tasks=1 error=\"redis unavailable in push: "
        assert down.stderr.startswith(pushed), down.stderr
    finally:
        await pool.execute("DELETE FROM workers WHERE id = 'w-quiet'")
