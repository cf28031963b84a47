"""The "a task finished" channel: how a request waiting for a task's end (``?wait=N``) learns of it.

A task finishes (completed, failed or cancelled) in a PostgreSQL statement; after the
commit, :meth:`FinishedChannel.announce` publishes the ids on ``{prefix}:finished``,
but only while the flag ``{prefix}:finished:waiters`` exists (one Lua call, one round
trip per committed batch; nothing is published when nobody waits). A waiting request
sets the flag (:meth:`FinishedChannel.mark_waiting`, with a TTL past its wait), its
instance's subscription (:meth:`FinishedChannel.subscribe`) hears the ids, and only
then is the task read again.

No end is missed: a waiter is subscribed and has set the flag before it reads the
task; an end committed before that read is seen by the read, one committed after it
finds the flag set when it is announced (the flag is read after the commit).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from redis.asyncio.client import PubSub

from taskmesh.errors import StoreError
from taskmesh.store.classify import REDIS_ERRORS, redis_call
from taskmesh.store.keys import Keys
from taskmesh.store.redis_types import RedisClient
from taskmesh.store.scripts import lua

POLL_SECONDS = 1.0
"""How long one read of the subscription waits for a message (then it reads again)."""


class FinishedChannel:
    """Publishing and hearing the ids of finished tasks (see module docs).

    :param client: the store's redis-py asyncio client (bytes replies).
    :param keys: the deployment's key builder.
    """

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        self.channel = keys.finished()
        self.flag = keys.finished_waiters()
        self._announce = client.register_script(lua("announce_finished"))

    async def announce(self, task_ids: Sequence[uuid.UUID | str]) -> bool:
        """Publish ``task_ids`` when someone waits; returns whether it published (``False``: nobody waits).

        :raises StoreError: Redis failed (a waiter then sees the end at its deadline).
        """
        if not task_ids:
            return False
        with redis_call("announce_finished"):
            return bool(await self._announce(keys=[self.flag], args=[self.channel, " ".join(map(str, task_ids))]))

    async def mark_waiting(self, seconds: float) -> None:
        """Keep the flag for at least ``seconds`` more (it is never shortened by another waiter).

        :raises StoreError: Redis failed.
        """
        ttl_ms = int(seconds * 1000) + 5000
        with redis_call("mark_waiting"):
            current = await self.client.pttl(self.flag)
            if current < ttl_ms:
                await self.client.set(self.flag, b"1", px=ttl_ms)

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[Subscription]:
        """Subscribe for the duration of the block; :meth:`Subscription.receive` gives the announced ids.

        :raises StoreError: Redis failed on subscribing.
        """
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            with redis_call("subscribe_finished"):
                await pubsub.subscribe(self.channel)
        except StoreError:
            with contextlib.suppress(*REDIS_ERRORS):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated before redis-py 8.2
            raise
        try:
            yield Subscription(pubsub)
        finally:
            # The connection may be gone already, or closed under us by the cluster client.
            with contextlib.suppress(*REDIS_ERRORS, RuntimeError, AttributeError):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]


class Subscription:
    """A live subscription to the finished-tasks channel."""

    def __init__(self, pubsub: PubSub) -> None:
        self._pubsub = pubsub

    async def receive(self, within: float = POLL_SECONDS) -> list[str] | None:
        """The ids of the next announcement, or ``None`` when none came within ``within`` seconds.

        :raises StoreError: Redis failed (the subscription is lost: subscribe again).
        """
        with redis_call("subscribe_finished"):
            message = await self._pubsub.get_message(timeout=within)
        if message is None or message.get("type") != "message":
            return None
        data = message["data"]
        text = data.decode("ascii", "replace") if isinstance(data, bytes) else str(data)
        return text.split()
