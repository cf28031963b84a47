"""An instance's first look at a queue that clients filled before any instance marked it.

Clients push what they enqueue; only the reconciler writes a queue's marker. Before, the first
instance to look at such a queue walked its whole backlog (a read of every queued row at every
deployment's first start) and, having pushed back the ids its fetcher held at that moment,
warned ``data lost``. Now the first look compares the two counts, walks only when Redis lacks
ids, and never claims a loss it cannot know of. The reconciler runs alone here, on real stores.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest
import redis.asyncio as aioredis
import structlog

from taskmesh.services import reconciler
from taskmesh.store.keys import Keys
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues the reconciler walks (the real walk still runs)."""
    seen: list[str] = []
    real = reconciler.walk

    async def counted(tasks: Tasks, queue: str, cursor: reconciler.Cursor, **options: Any) -> int:
        seen.append(queue)
        return await real(tasks, queue, cursor, **options)

    monkeypatch.setattr(reconciler, "walk", counted)
    return seen


async def pop(redis_client: aioredis.Redis, keys: Keys, n: int) -> set[str]:
    """Pop ``n`` ids of the default queue's ready set, as a fetcher does; returns them."""
    popped = await redis_client.zpopmin(keys.ready("default"), n)  # the client decodes responses
    assert len(popped) == n
    return {str(pair[0]) for pair in popped}


def resynced(logs: list[MutableMapping[str, Any]]) -> list[tuple[str, int, str]]:
    return [(e["log_level"], e["pushed"], e["reason"]) for e in logs if e["event"] == "redis_resynced"]


async def test_a_first_look_at_a_queue_clients_filled_marks_it_without_walking_or_warning(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, walks: list[str]
) -> None:
    await tasks.enqueue_many([TaskSpec(name="filled") for _ in range(300)])
    assert not await redis_client.exists(keys.marker("default"))
    with structlog.testing.capture_logs() as logs:
        pushed = await reconciler.check(tasks, ["default"], reconciler.State(), instance="first")
    assert (pushed, walks) == (0, [])
    assert [level for level, _, _ in resynced(logs)] in ([], ["info"])  # never a warning (info may be filtered)
    assert await redis_client.exists(keys.marker("default"))
    assert await redis_client.zcard(keys.ready("default")) == 300


async def test_a_first_look_walks_the_queue_when_redis_lacks_queued_tasks_and_says_no_more_than_it_knows(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, walks: list[str]
) -> None:
    made = await tasks.enqueue_many([TaskSpec(name="filled") for _ in range(300)])
    lost = [str(e.task_id) for e in made[100:120]]  # a client's push that never arrived
    assert await redis_client.zrem(keys.ready("default"), *lost) == 20
    with structlog.testing.capture_logs() as logs:
        pushed = await reconciler.check(tasks, ["default"], reconciler.State(), instance="first")
    assert (pushed, walks) == (20, ["default"])
    assert resynced(logs) == [("warning", 20, "no marker yet")]
    assert await redis_client.zcard(keys.ready("default")) == 300


async def test_a_queue_seen_before_whose_marker_went_is_walked_and_called_lost(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, walks: list[str]
) -> None:
    await tasks.enqueue_many([TaskSpec(name="filled") for _ in range(300)])
    state = reconciler.State()
    await reconciler.check(tasks, ["default"], state, instance="first")
    walks.clear()
    await redis_client.delete(keys.marker("default"), keys.ready("default"))  # a flush of the queue's keys
    with structlog.testing.capture_logs() as logs:
        pushed = await reconciler.check(tasks, ["default"], state, instance="first")
    assert (pushed, walks) == (300, ["default"])
    assert resynced(logs) == [("warning", 300, "data lost")]


async def test_ids_a_fetcher_holds_between_its_pop_and_its_claim_are_not_taken_for_lost_ones(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, walks: list[str]
) -> None:
    # A drain at the first look: the fetcher popped 40 ids and its claim has not answered yet.
    await tasks.enqueue_many([TaskSpec(name="filled") for _ in range(300)])
    held = await pop(redis_client, keys, 40)

    def popped(queue: str) -> set[str]:
        return held if queue == "default" else set()

    with structlog.testing.capture_logs() as logs:
        pushed = await reconciler.check(tasks, ["default"], reconciler.State(), instance="first", popped=popped)
    assert (pushed, walks) == (0, [])
    assert [level for level, _, _ in resynced(logs)] in ([], ["info"])
    assert await redis_client.zcard(keys.ready("default")) == 260  # nothing pushed back as a ghost

    # The sweep's count is the same: no walk while the ids are in a claim.
    counts = await reconciler.sweep(tasks, ["default"], reconciler.State(), min_age=0, full=False, popped=popped)
    assert (counts["repushed"], walks) == (0, [])

    # Not counting them, the same sweep takes them for lost and pushes them back.
    counts = await reconciler.sweep(tasks, ["default"], reconciler.State(), min_age=0, full=False)
    assert (counts["repushed"], walks) == (40, ["default"])


async def test_a_lost_id_is_still_found_while_a_fetcher_holds_popped_ids(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, walks: list[str]
) -> None:
    made = await tasks.enqueue_many([TaskSpec(name="filled") for _ in range(300)])
    held = await pop(redis_client, keys, 40)  # held by a fetcher
    lost = str(made[299].task_id)  # and one push that never arrived
    assert await redis_client.zrem(keys.ready("default"), lost) == 1
    counts = await reconciler.sweep(
        tasks, ["default"], reconciler.State(), min_age=0, full=False, popped=lambda queue: held
    )
    assert walks == ["default"]
    assert counts["repushed"] == 1  # the lost id; the held ones are left to their claim
    assert await redis_client.zscore(keys.ready("default"), lost) is not None
    assert await redis_client.zmscore(keys.ready("default"), sorted(held)) == [None] * 40


async def test_the_full_walk_pushes_back_no_id_held_in_a_claim(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, walks: list[str]
) -> None:
    # Once a minute the sweep walks every queue whatever the counts say, in the middle of a drain.
    await tasks.enqueue_many([TaskSpec(name="filled") for _ in range(300)])
    held = await pop(redis_client, keys, 40)
    counts = await reconciler.sweep(
        tasks, ["default"], reconciler.State(), min_age=0, full=True, popped=lambda queue: held
    )
    assert (counts["repushed"], walks) == (0, ["default"])
    assert await redis_client.zcard(keys.ready("default")) == 260


async def test_an_id_claimed_between_the_walks_read_and_redis_answer_is_not_pushed_back(
    tasks: Tasks, redis_client: aioredis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another instance pops and claims ids after the walk read them as queued and before Redis
    # is asked: absent from Redis, running in PostgreSQL. Pushed back, each would be a ghost.
    await tasks.enqueue_many([TaskSpec(name="filled") for _ in range(300)])
    real = tasks.redis.absent
    claimed: list[str] = []

    async def absent_after_a_claim(targets: Any) -> Any:
        if not claimed:
            ids = sorted(await pop(redis_client, keys, 30))
            claimed.extend(str(c.task_id) for c in await tasks.claim("default", ids, "other", 30))
        return await real(targets)

    monkeypatch.setattr(tasks.redis, "absent", absent_after_a_claim)
    counts = await reconciler.sweep(tasks, ["default"], reconciler.State(), min_age=0, full=True)
    assert (len(claimed), counts["repushed"]) == (30, 0)
    assert await redis_client.zmscore(keys.ready("default"), claimed) == [None] * 30
