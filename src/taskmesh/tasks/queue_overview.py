"""What the operator sees of a queue: depths by state, age, pause, workers, runs per minute.

``GET /api/v1/queues`` and ``GET /api/v1/queues/{q}`` answer with :func:`overview`.
Every figure comes from a bounded read: ready and delayed sizes from Redis
(``ZCARD``, what the fetchers see; ``delayed`` includes the tasks waiting out a
retry backoff); retrying, running and dead-lettered counts and the oldest ready
age from PostgreSQL through partial indexes (``queue_depths``); the pause from
``queues``; the instances serving the queue from the live rows of ``workers``;
ended runs of the last full minute and of the current one from ``queue_minutes``
(every instance's sampler adds its own there every ``metrics_sample_seconds``, so
``this_minute`` lags by up to that much).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taskmesh.store import Stores
from taskmesh.store.queue_queries import MINUTE_COLUMNS
from taskmesh.tasks.records import json_value, pause_to_dict
from taskmesh.tasks.states import WorkerState

QUEUES_LISTED = 1000
"""Most queues ``GET /api/v1/queues`` lists (by name); ``queue_list_known`` has the same bound."""
WORKERS_READ = 1000
"""Most worker rows read to find the instances serving each queue."""
LIVE = (WorkerState.RUNNING, WorkerState.DRAINING)


async def known_queues(stores: Stores) -> list[str]:
    """Queues with queued, running or dead-lettered tasks, paused ones, and those live instances serve.

    At most :data:`QUEUES_LISTED`, by name.
    """
    names = set(await stores.pg.queues.list_known())
    names.update(await stores.pg.workers.served_queues(QUEUES_LISTED))
    return sorted(names)[:QUEUES_LISTED]


async def overview(stores: Stores, queues: Sequence[str]) -> list[dict[str, Any]]:
    """Each of ``queues`` in the API's shape, in the given order.

    :returns: per queue ``{"queue", "paused", "paused_at", "reason", "depth": {"ready", "delayed",
        "retrying", "running", "dead_letter"}, "oldest_ready_age_seconds", "workers": [{"worker_id",
        "state", "concurrency"}], "concurrency", "runs": {"last_minute": {...}, "this_minute": {...}}}``,
        the run counts by outcome (``succeeded``, ``retried``, ``failed``, ``cancelled``, ``interrupted``).
    :raises StoreError: a store failed.
    """
    queues = list(queues)
    if not queues:
        return []
    sizes = await stores.redis.sizes(queues)
    depths = {r["queue"]: r for r in await stores.pg.queues.depths(queues)}
    pauses = {r["name"]: r for r in await stores.pg.queues.list_paused(QUEUES_LISTED)}
    serving = _serving(await stores.pg.workers.list(WORKERS_READ))
    runs: dict[str, dict[str, dict[str, int]]] = {}
    for row in await stores.pg.queues.recent_minutes(queues):
        window = "this_minute" if row["current"] else "last_minute"
        runs.setdefault(row["queue"], {})[window] = {c: int(row[c]) for c in MINUTE_COLUMNS}
    zero = dict.fromkeys(MINUTE_COLUMNS, 0)
    out = []
    for queue in queues:
        ready, delayed = sizes.get(queue, (0, 0))
        depth = depths[queue]
        workers = serving.get(queue, [])
        out.append(
            {
                **pause_to_dict(queue, pauses.get(queue)),
                "depth": {
                    "ready": ready,
                    "delayed": delayed,
                    "retrying": depth["retrying"],
                    "running": depth["running"],
                    "dead_letter": depth["dead_letter"],
                },
                "oldest_ready_age_seconds": round(depth["oldest_ready_age_seconds"], 3),
                "workers": workers,
                "concurrency": sum(w["concurrency"] for w in workers),
                "runs": {
                    "last_minute": runs.get(queue, {}).get("last_minute", zero),
                    "this_minute": runs.get(queue, {}).get("this_minute", zero),
                },
            }
        )
    return out


def _serving(rows: Sequence[Any]) -> dict[str, list[dict[str, Any]]]:
    """``{queue: [{"worker_id", "state", "concurrency"}]}`` of the live instances among ``rows``."""
    serving: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["state"] not in LIVE:
            continue
        for queue, concurrency in (json_value(row["queues"]) or {}).items():
            serving.setdefault(queue, []).append(
                {"worker_id": row["id"], "state": row["state"], "concurrency": int(concurrency)}
            )
    return serving
