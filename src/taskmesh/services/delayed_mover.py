"""Delayed mover: due task ids go from each queue's delayed set to its ready set.

Every ``interval`` seconds (``delayed_poll_seconds``, default 0.1) it runs
``delayed_move.lua`` once per queue of this instance, under that queue's short
lock ``{prefix}:lock:delayed_mover:{q}`` (``SET NX PX``, released after the
move; it only saves work, the script is safe to run anywhere at once). A queue
no other instance serves is therefore never left waiting for a lock holder
that does not serve it. "Due" is by PostgreSQL's clock (``clock.StoreClock``),
the clock the claim checks. The same call moves back what may start of the ids parked by the task
limits (``store/redis_limits.py``) whose time came. Tick counts: ``moved``.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskmesh.limits.book import LimitBook
from taskmesh.services.base import Counts, run_periodic
from taskmesh.store import RedisStore

LOCK_MS = 1000


async def run_once(
    redis: RedisStore, queues: Sequence[str], lock_ms: int = LOCK_MS, limits: LimitBook | None = None
) -> Counts:
    """One tick over ``queues``; a queue whose lock another instance holds is skipped this tick.

    The same script call moves back to ready what may start of the parked ids of the limit keys
    whose time came (a rate's next start, a back-off's end, a lapsing slot), held to ``limits``.

    :returns: ``{"moved": n}``.
    :raises StoreError: Redis failed.
    """
    moved = 0
    args = (limits or LimitBook()).script_args()
    for queue in queues:
        key = redis.keys.lock("delayed_mover", queue)
        token = await redis.limits.try_lock(key, lock_ms)
        if token is None:
            continue
        try:
            moved += await redis.move_due(queue, limits=args)
        finally:
            await redis.limits.release_lock(key, token)
    return {"moved": moved}


async def run(
    redis: RedisStore, queues: Sequence[str], *, interval: float = 0.1, limits: LimitBook | None = None
) -> None:
    """Tick for ever (cancelled by the supervisor)."""
    await run_periodic("delayed_mover", lambda: run_once(redis, queues, limits=limits), interval=interval)
