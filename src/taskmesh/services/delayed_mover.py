"""Delayed mover: due task ids go from each queue's delayed set to its ready set.

Every ``interval`` seconds (``delayed_poll_seconds``, default 0.1) it runs
``delayed_move.lua`` once per queue of this instance, under that queue's short
lock ``{prefix}:lock:delayed_mover:{q}`` (``SET NX PX``, released after the
move; it only saves work, the script is safe to run anywhere at once). A queue
no other instance serves is therefore never left waiting for a lock holder
that does not serve it. "Due" is by PostgreSQL's clock (``clock.StoreClock``),
the clock the claim checks. The same call moves back what may start of the ids parked by the task
limits (``store/redis_limits.py``) whose time came, and says when the earliest of those keys is to be
looked at again: the next tick comes then when that is sooner than ``interval`` (a rate of 20 starts a
second needs a look every 50 ms, and one a few milliseconds late, not up to a tick late). Tick counts:
``moved``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from taskmesh.limits.book import LimitBook
from taskmesh.services.base import Counts, run_periodic
from taskmesh.store import RedisStore

LOCK_MS = 1000
SOONEST_SECONDS = 0.005
"""Shortest wait between ticks when a limit key's look is already due (more keys came due than one call looks at)."""


@dataclass(slots=True)
class NextLook:
    """When a limit key the last tick saw is to be looked at again, on ``anyio.current_time()``'s clock
    (``None``: none, or the tick did not get that far)."""

    at: float | None = None


async def run_once(
    redis: RedisStore,
    queues: Sequence[str],
    lock_ms: int = LOCK_MS,
    limits: LimitBook | None = None,
    next_look: NextLook | None = None,
) -> Counts:
    """One tick over ``queues``; a queue whose lock another instance holds is skipped this tick.

    The same script call moves back to ready what may start of the parked ids of the limit keys
    whose time came (a rate's next start, a back-off's end, a lapsing slot), held to ``limits``.

    :param next_look: set to when the earliest of the limit keys seen is to be looked at again.
    :returns: ``{"moved": n}``.
    :raises StoreError: Redis failed.
    """
    moved = 0
    soonest: float | None = None
    if next_look is not None:
        next_look.at = None
    args = (limits or LimitBook()).script_args()
    for queue in queues:
        key = redis.keys.lock("delayed_mover", queue)
        token = await redis.limits.try_lock(key, lock_ms)
        if token is None:
            continue
        try:
            n, look_in = await redis.move_due(queue, limits=args)
        finally:
            await redis.limits.release_lock(key, token)
        moved += n
        if look_in is not None and (soonest is None or look_in < soonest):
            soonest = look_in
    if next_look is not None and soonest is not None:
        next_look.at = anyio.current_time() + soonest
    return {"moved": moved}


async def run(
    redis: RedisStore, queues: Sequence[str], *, interval: float = 0.1, limits: LimitBook | None = None
) -> None:
    """Tick for ever (cancelled by the supervisor): every ``interval`` seconds, or sooner when a limit key's
    next look comes sooner."""
    next_look = NextLook()

    async def sleep(seconds: float) -> None:
        if next_look.at is not None:
            seconds = min(seconds, max(SOONEST_SECONDS, next_look.at - anyio.current_time()))
        await anyio.sleep(seconds)

    await run_periodic(
        "delayed_mover",
        lambda: run_once(redis, queues, limits=limits, next_look=next_look),
        interval=interval,
        sleep=sleep,
    )
