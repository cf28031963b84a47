"""What a limit holds now, per queue and key: runs in its slots, ids parked waiting for it, a back-off.

Read from Redis for ``GET /api/v1/limits``, the CLI and the console. A limit without a ``key`` has one
counter per queue, and more named by tasks' ``concurrency_key``; the counters of values (of its ``key``,
or named by a ``concurrency_key``) are shown when they have ids parked (at most :data:`KEYS_SHOWN` per
queue), or the one key a tenant-bound caller may see.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taskmesh.limits.book import LimitBook
from taskmesh.limits.settings import LimitSettings
from taskmesh.store import RedisStore

KEYS_SHOWN = 100


def describe(book: LimitBook, name: str) -> dict[str, Any]:
    """A limit in force in the API's shape, without its usage: its settings, ``source`` (``config`` or
    ``api``), ``updated_at`` and ``updated_by`` (of a limit set at run time, else ``None``)."""
    settings: LimitSettings = book.limits[name]
    override = book.overrides.get(name)
    return {
        "name": name,
        **settings.model_dump(),
        "source": book.source(name),
        "updated_at": override.updated_at.isoformat() if override is not None else None,
        "updated_by": override.updated_by if override is not None else None,
    }


async def usage(
    redis: RedisStore, book: LimitBook, name: str, queues: Sequence[str], only_key: str | None = None
) -> list[dict[str, Any]]:
    """``[{"queue", "key", "in_use", "waiting", "backing_off_until_ms"}]`` of limit ``name`` in ``queues``
    (its own queue when it names one), each key with runs or ids parked.

    :param only_key: the one limit key to show (a tenant-bound caller's own).
    :raises StoreError: Redis failed.
    """
    settings = book.limits[name]
    out: list[dict[str, Any]] = []
    for queue in [settings.queue] if settings.queue is not None else queues:
        if only_key is not None:
            keys = [only_key]
        else:  # a limit's own counter, and those named by tasks' concurrency_key or its key with tasks waiting
            waiting = await redis.limits.waiting_keys(queue, f"{name}:", KEYS_SHOWN)
            keys = ([name] if settings.key is None else []) + sorted(waiting)
        for key, (in_use, parked, until) in (await redis.limits.in_use(queue, keys)).items():
            if in_use or parked or until or (settings.key is None and settings.queue is not None):
                out.append(
                    {"queue": queue, "key": key, "in_use": in_use, "waiting": parked, "backing_off_until_ms": until}
                )
    return out
