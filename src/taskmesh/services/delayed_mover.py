"""Delayed mover: due task ids go from each queue's delayed set to its ready set.

Every ``interval`` seconds (default 0.1) it takes the short singleton lock
``{prefix}:lock:delayed_mover`` (``SET NX PX``; it only saves work, the Lua
script is safe to run anywhere at once) and runs ``delayed_move.lua`` per
queue. Logs ``tasks_moved`` with counts; on a Redis failure it logs once per
outage and backs off.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import structlog

from taskmesh.services.outage import STORE_ERRORS, Outage
from taskmesh.store import redis as rstore
from taskmesh.store.keys import Keys

log = structlog.get_logger("taskmesh.delayed_mover")


async def run_once(client: rstore.Redis, keys: Keys, queues: Sequence[str], lock_ms: int = 1000) -> int:
    """One tick: returns ids moved (0 when another instance holds the lock)."""
    lock_key = keys.lock("delayed_mover")
    token = await rstore.try_lock(client, lock_key, lock_ms)
    if token is None:
        return 0
    try:
        moved = 0
        for queue in queues:
            moved += await rstore.move_due(client, keys, queue)
        return moved
    finally:
        await rstore.release_lock(client, lock_key, token)


async def run(client: rstore.Redis, keys: Keys, queues: Sequence[str], *, interval: float = 0.1) -> None:
    """Tick forever (cancelled by the supervisor)."""
    outage = Outage("delayed_mover")
    while True:
        try:
            moved = await run_once(client, keys, queues)
        except STORE_ERRORS as exc:
            await outage.failed(exc)
            continue
        outage.recovered()
        if moved:
            log.debug("tasks_moved", count=moved)
        await anyio.sleep(interval)
