"""The stores: PostgreSQL (the truth) and Redis (the dispatch index), each behind one typed wrapper.

Nothing outside this package touches the asyncpg pool or the redis-py client;
everything else calls :class:`~taskmesh.store.postgres.PgStore` and
:class:`~taskmesh.store.redis.RedisStore` methods, which raise only
:class:`~taskmesh.errors.StoreError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from taskmesh.store.keys import Keys
from taskmesh.store.postgres import PgStore
from taskmesh.store.redis import RedisStore, wall_ms
from taskmesh.store.redis_types import RedisMode

__all__ = ["Keys", "PgStore", "RedisStore", "Stores"]


@dataclass(frozen=True, slots=True)
class Stores:
    """One instance's (or client's) two stores."""

    pg: PgStore
    redis: RedisStore

    @classmethod
    async def open(
        cls,
        database_url: str,
        redis_url: str,
        *,
        redis_prefix: str = "taskmesh",
        pool_size: int = 10,
        now_ms: Callable[[], int] = wall_ms,
        pooler: str = "none",
        redis_mode: RedisMode = "standalone",
    ) -> Stores:
        """Open the PostgreSQL pool and a Redis client (Redis connects lazily).

        :param pooler: ``transaction`` when ``database_url`` is PgBouncer in transaction mode
            (see :meth:`PgStore.connect`).
        :param redis_mode: ``cluster`` for a Redis Cluster (see :meth:`RedisStore.connect`).
        :raises StoreError: PostgreSQL did not answer or refused.
        """
        pg = await PgStore.connect(database_url, pool_size, pooler=pooler)
        return cls(pg, RedisStore.connect(redis_url, Keys(redis_prefix), mode=redis_mode, now_ms=now_ms))

    async def close(self) -> None:
        """Close both (bounded: a dead server cannot hold the caller)."""
        await self.redis.close()
        await self.pg.close()
