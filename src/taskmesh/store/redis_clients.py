"""The redis-py client for a deployment's Redis: standalone, Redis Cluster or behind Sentinel.

One place decides which client class talks to Redis, so the rest of the store sees one
interface (:data:`~taskmesh.store.redis_types.RedisClient`):

- ``standalone``: :class:`redis.asyncio.Redis` on ``redis://``, ``rediss://`` or ``unix://``.
- ``cluster`` (``redis_mode = "cluster"``): :class:`redis.asyncio.cluster.RedisCluster`, which
  learns the nodes from the one named, routes each command to the node owning its key's slot
  and follows ``MOVED`` and ``ASK``; every key of a queue shares the ``{queue}`` hash tag, so
  each Lua script and pipeline group touches one slot.
- Sentinel (a ``redis+sentinel://`` URL): a standalone client whose connections ask the
  Sentinels for the master's address, and reconnect to the new master after a failover.

Every mode packs commands with hiredis (``store/redis_packing.py``).

Timeouts are the same in every mode: connect 2 s; reads may take 10 s (a blocking pop asks the
server to wait up to its own timeout, which stays below that).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from taskmesh.store.redis_packing import use_hiredis_packing
from taskmesh.store.redis_types import RedisClient, RedisMode
from taskmesh.store.redis_urls import SENTINEL_SCHEMES, parse_sentinel_url

CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 10.0
_COMMON: dict[str, Any] = {
    "socket_connect_timeout": CONNECT_TIMEOUT,
    "socket_timeout": READ_TIMEOUT,
    "decode_responses": False,
}


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names Sentinels (``redis+sentinel://`` or ``rediss+sentinel://``)."""
    return url.split("://", 1)[0] in SENTINEL_SCHEMES


def open_client(url: str, mode: RedisMode = "standalone", *, decode: bool = False) -> RedisClient:
    """A client of the kind ``url`` and ``mode`` call for (connects lazily; no I/O here).

    :param url: a URL :func:`~taskmesh.store.redis_urls.check_redis_url` accepts.
    :param mode: ``cluster`` for a Redis Cluster (then ``url`` names any one node, database 0).
    :param decode: replies as ``str`` (tools and tests), not ``bytes`` (the store).
    :raises ValueError: a Sentinel URL with ``mode = "cluster"`` (Sentinel watches one master).
    """
    common = {**_COMMON, "decode_responses": decode}
    if is_sentinel_url(url):
        if mode == "cluster":
            raise ValueError('a redis+sentinel:// URL names one master: use redis_mode = "standalone"')
        return use_hiredis_packing(_sentinel_client(url, common))
    if mode == "cluster":
        return use_hiredis_packing(RedisCluster.from_url(url, **common))
    return use_hiredis_packing(aioredis.Redis.from_url(url, health_check_interval=15, **common))


def _sentinel_client(url: str, common: dict[str, Any]) -> aioredis.Redis:
    target = parse_sentinel_url(url)
    sentinel_kwargs: dict[str, Any] = {"socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": CONNECT_TIMEOUT}
    if target.sentinel_password is not None:
        sentinel_kwargs.update(username=target.sentinel_username, password=target.sentinel_password)
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]  # unannotated before redis-py 8.2
        target.sentinels, sentinel_kwargs=sentinel_kwargs, health_check_interval=15, **common
    )
    client: aioredis.Redis = sentinel.master_for(
        target.master, db=target.db, username=target.username, password=target.password, ssl=target.tls
    )
    return client
