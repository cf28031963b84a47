"""The redis-py client types the store speaks to, below both the client factory and the packer.

:data:`RedisClient` is one interface over every mode (standalone, Sentinel, Redis Cluster):
:mod:`taskmesh.store.redis_clients` makes one, :mod:`taskmesh.store.redis_packing` fits it with
hiredis's packer, and the store's modules take one.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

RedisClient: TypeAlias = aioredis.Redis | RedisCluster
"""A client of any mode: Sentinel's is a standalone client that asks the Sentinels for the master."""
RedisMode = Literal["standalone", "cluster"]
"""``redis_mode``: one server (or Sentinel's master), or a Redis Cluster."""
