"""Coordination in Redis that is not dispatch: singleton locks and GCRA rate limits, shared by every instance.

The services that one instance at a time should run (the delayed mover per queue, the
reconciler's sweeps, retention) take a short lock (``SET NX PX``, released by a script only by
its holder); a lock only saves work, it never guards correctness (docs/internals/design.md
principle 5). A rate limit is a GCRA bucket (``lua/rate_limit.lua``) on Redis's clock: one
script call decides ``cost`` requests, so every instance draws from one bucket. The API's
rate limits and the tenants' enqueue quotas use it.
"""

from __future__ import annotations

import secrets

from taskmesh.store.classify import redis_call
from taskmesh.store.keys import Keys
from taskmesh.store.redis_types import RedisClient
from taskmesh.store.scripts import lua


class RedisLimits:
    """Locks and rate limits in the deployment's Redis (see module docs).

    :param client: the store's redis-py asyncio client (bytes replies).
    :param keys: the deployment's key builder.
    """

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._release = client.register_script(lua("lock_release"))
        self._rate = client.register_script(lua("rate_limit"))

    async def try_lock(self, key: str, ttl_ms: int) -> str | None:
        """Take a short singleton lock (``SET key token NX PX ttl``).

        :param key: the lock's Redis key (``Keys.lock``).
        :param ttl_ms: how long the lock holds unless released, milliseconds.
        :returns: the holder token, or ``None`` when another holder has it.
        :raises StoreError: Redis failed.
        """
        token = secrets.token_hex(8)
        with redis_call("try_lock"):
            ok = await self.client.set(key, token, nx=True, px=ttl_ms)
        return token if ok else None

    async def release_lock(self, key: str, token: str) -> bool:
        """Release a lock taken by :meth:`try_lock` if it is still ours.

        :returns: whether it was ours (``False``: it expired, perhaps taken by another holder since).
        :raises StoreError: Redis failed.
        """
        with redis_call("release_lock"):
            released = await self._release(keys=[key], args=[token])
        return bool(released)

    async def rate_limit(
        self, bucket: str, per_second: float, burst: int, cost: int = 1
    ) -> tuple[bool, int, float, float]:
        """``cost`` requests (1..``burst``) against the GCRA bucket ``bucket`` (``lua/rate_limit.lua``), on
        Redis's clock.

        :param per_second: the bucket's sustained rate, requests per second.
        :param burst: how many requests may come at once after a quiet spell.
        :returns: ``(allowed, remaining, retry_after_seconds, reset_seconds)``.
        :raises StoreError: Redis failed.
        """
        with redis_call("rate_limit"):
            allowed, remaining, retry_us, reset_us = await self._rate(
                keys=[self.keys.rate_limit(bucket)], args=[round(1_000_000 / per_second), burst, cost]
            )
        return bool(allowed), int(remaining), int(retry_us) / 1e6, int(reset_us) / 1e6
