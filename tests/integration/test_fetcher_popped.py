"""A fetcher holds the ids it popped until their claim answers (the reconciler reads them).

Without it, every count the reconciler took during a drain looked like lost ids.
The fetcher runs alone on real stores; the claim is the real one, wrapped to look at the count.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import pytest

from taskmesh.errors import StoreError
from taskmesh.services.committer import Committer
from taskmesh.services.worker_pool import QueueWorkers
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(tasks: Tasks, registry: Registry) -> Iterator[QueueWorkers]:
    pool = QueueWorkers(
        "default",
        tasks=tasks,
        registry=registry,
        committer=Committer(tasks, "w1"),
        worker_id="w1",
        concurrency=4,
        prefetch=4,
        lease_seconds=30,
        stop=anyio.Event(),
    )
    yield pool
    pool.release()
    pool.committer.release()


async def test_popped_ids_are_held_until_their_claim_answers(
    tasks: Tasks, workers: QueueWorkers, monkeypatch: pytest.MonkeyPatch
) -> None:
    await tasks.enqueue_many([TaskSpec(name="t") for _ in range(5)])
    pool = workers
    seen: list[set[str]] = []
    real = tasks.claim

    async def claim(queue: str, ids: Sequence[str], *args: Any) -> Any:
        seen.append(set(pool.popped))
        return await real(queue, ids, *args)

    monkeypatch.setattr(tasks, "claim", claim)
    claimed = await pool.fetch_once(3)
    assert (len(claimed), seen, pool.popped) == (3, [{str(c.task_id) for c in claimed}], set())


async def test_the_ids_are_let_go_when_the_claim_fails(
    tasks: Tasks, workers: QueueWorkers, monkeypatch: pytest.MonkeyPatch
) -> None:
    await tasks.enqueue_many([TaskSpec(name="t") for _ in range(2)])
    pool = workers

    async def claim(queue: str, ids: Sequence[str], *args: Any) -> Any:
        raise StoreError("postgres", "claim", transient=True, detail="connection lost")

    monkeypatch.setattr(tasks, "claim", claim)
    with pytest.raises(StoreError):
        await pool.fetch_once(2)
    assert pool.popped == set()
