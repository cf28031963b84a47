"""The Redis store: pushes into the per-queue structures, pops, the Lua scripts, markers.

:class:`RedisStore` is the only holder of the redis-py client. Redis holds only
task ids (docs/internals/design.md principle 1); every method can be repeated safely: pushes
use ``ZADD NX``, the DLQ mirror removes before it adds. Lua scripts are loaded
from ``lua/`` and registered once (called by SHA, loaded again after a
``SCRIPT FLUSH`` or a restart). Every failure is a
:class:`~taskmesh.errors.StoreError` naming the operation, transient or not.

Replies are read as bytes and decoded here: a member that is not a task id
taskmesh wrote (foreign bytes, a hand-typed key) is set aside in the queue's
``foreign`` list, logged (``redis_foreign_member``, at most once a minute per
key with a count and a sample) and never returned, so no reply can stop an
instance.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import MasterNotFoundError, SentinelConnectionPool

from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.store.classify import REDIS_ERRORS, redis_call, redis_error
from taskmesh.store.finished import FinishedChannel
from taskmesh.store.keys import (
    DELAYED_PRIORITY_SLOTS,
    DLQ_MIRROR_MAX,
    EPOCH_MS,
    LEGACY_DELAYED_SCORE_MAX,
    PRIORITY_STEP,
    Keys,
    delayed_score,
    ready_score,
)
from taskmesh.store.redis_clients import open_client
from taskmesh.store.redis_limits import SEPARATOR as LIMIT_KEY_SEPARATOR
from taskmesh.store.redis_limits import LimitArgs, RedisLimits
from taskmesh.store.redis_types import RedisClient, RedisMode
from taskmesh.store.redis_urls import (
    PLAIN_ON_TLS,
    TLS_FAILED,
    cluster_refusal,
    refusal,
    sentinel_refusal,
    speaks_plain_redis,
)
from taskmesh.store.scripts import lua
from taskmesh.tasks.models import PushTarget

log = get_logger("taskmesh.redis")

FOREIGN_KEPT = 1000
"""Most set-aside members kept per queue (newest first)."""
FOREIGN_LOG_EVERY_SECONDS = 60.0
PROBED_QUEUES = 16
"""Most queues whose keys ``/readyz`` touches."""


def wall_ms() -> int:
    """This host's clock in milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


FAR_FUTURE_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the due time of a task whose ``run_at`` is ``infinity``."""


def due_ms(at: datetime) -> int | None:
    """A due time in milliseconds since the Unix epoch; ``None`` for one that is due at any time.

    asyncpg reads PostgreSQL's ``-infinity`` and ``infinity`` as naive ``datetime.min`` and
    ``datetime.max`` (every finite ``timestamptz`` comes aware): a row taskmesh did not write
    may hold them. ``-infinity`` and any instant Python cannot place are due now; ``infinity``
    is :data:`FAR_FUTURE_MS`.
    """
    if at.tzinfo is None:
        return FAR_FUTURE_MS if at == datetime.max else None
    try:
        return int(at.timestamp() * 1000)
    except (OverflowError, ValueError):
        return None


def _run_id(info: object) -> str:
    """The ``run_id`` field of an ``INFO server`` reply ('' when absent)."""
    run_id = info.get("run_id", "") if isinstance(info, dict) else ""
    return run_id.decode() if isinstance(run_id, bytes) else str(run_id)


def _text(raw: bytes | str) -> str | None:
    """A task id as text, or ``None`` when ``raw`` is not one taskmesh wrote (a canonical UUID)."""
    try:
        text = raw.decode("ascii") if isinstance(raw, bytes) else raw
        return text if len(text) == 36 and str(uuid.UUID(text)) == text else None
    except (UnicodeDecodeError, ValueError):
        return None


class RedisStore:
    """Redis, as taskmesh uses it (see module docs).

    :param client: a redis-py asyncio client with ``decode_responses=False``: standalone (perhaps
        behind Sentinel) or a cluster client (``store.redis_clients``).
    :param keys: the deployment's key builder.
    :param now_ms: the instance's clock in ms (corrected to PostgreSQL's; see ``clock.StoreClock``),
        used for ready scores and due times.
    """

    def __init__(self, client: RedisClient, keys: Keys, *, now_ms: Callable[[], int] = wall_ms) -> None:
        self.client = client
        self.keys = keys
        self.now_ms = now_ms
        self._move = client.register_script(lua("limits_lib") + lua("fair_lib") + lua("delayed_move"))
        self._fair_push = client.register_script(lua("limits_lib") + lua("fair_lib") + lua("fair_push"))
        self.fair_args: Callable[[str], list[str | float] | None] = lambda _queue: None
        self.priority_step: Callable[[str], int] = lambda _queue: PRIORITY_STEP
        """A queue's ready-score step between priorities (``LimitBook.priority_step``; the task facade sets it)."""
        """The fair shares of a queue as the scripts read them (``LimitBook.fair_args``; the task facade sets it)."""
        self.finished = FinishedChannel(client, keys)
        self.limits = RedisLimits(client, keys, now_ms=now_ms)
        self._foreign_logged: dict[str, float] = {}

    @classmethod
    def connect(
        cls, redis_url: str, keys: Keys, *, mode: RedisMode = "standalone", now_ms: Callable[[], int] = wall_ms
    ) -> RedisStore:
        """A store on a new client with short timeouts (connects lazily; no I/O here).

        :param mode: ``cluster`` for a Redis Cluster; a ``redis+sentinel://`` URL says Sentinel
            by itself (``store.redis_clients.open_client``).
        """
        return cls(open_client(redis_url, mode), keys, now_ms=now_ms)

    async def close(self) -> None:
        """Close the client's connections (errors ignored: closing a dead link is fine)."""
        try:
            await self.client.aclose()
        except REDIS_ERRORS:
            pass

    async def ping(self) -> None:
        """``PING``.

        :raises StoreError: Redis did not answer.
        """
        with redis_call("ping"):
            await self.client.ping()

    async def check_server(self) -> None:
        """Start-up check that the server is one taskmesh can use as configured.

        ``PING`` on a new connection (which does the TLS handshake, ``AUTH`` and ``SELECT``
        first), then ``INFO cluster``: a Redis Cluster node behind a standalone client would
        answer ``MOVED`` for most keys, so it is refused here, not met later. A cluster client
        learns the topology first (``CLUSTER SLOTS``) and pings every node; behind Sentinel, the
        Sentinels are asked for the master first.

        :raises StoreError: transient when Redis did not answer (start-up waits and says so);
            not transient, with a message naming ``redis_url`` (``store.redis_urls.refusal``),
            when it refused the password or the database number, the TLS handshake failed, a
            standalone client met a cluster node or a cluster client a node that is not one, or
            the Sentinels answered but know no master by that name: retrying cannot fix those.
        """
        try:
            if isinstance(self.client, RedisCluster):
                await self.client.ping(target_nodes=RedisCluster.ALL_NODES)
                return
            await self.client.ping()
            info = await self.client.info("cluster")
        except REDIS_ERRORS as exc:
            message = refusal(exc)
            if isinstance(exc, MasterNotFoundError):
                message = await self._unknown_master()
            tls = self._tls_address()
            tls_failed = message is None or message.startswith(TLS_FAILED)
            if tls is not None and tls_failed and await speaks_plain_redis(*tls):
                message = PLAIN_ON_TLS
            if message is None:
                raise redis_error("ping", exc) from exc
            raise StoreError("redis", "connect", transient=False, detail=message) from exc
        if isinstance(info, dict) and str(info.get("cluster_enabled", "0")) == "1":
            raise StoreError("redis", "connect", transient=False, detail=cluster_refusal("cluster_enabled:1"))

    async def _unknown_master(self) -> str | None:
        """The refusal when the Sentinels answer but none knows the master's name; ``None`` otherwise."""
        pool = self.client.connection_pool if isinstance(self.client, aioredis.Redis) else None
        if not isinstance(pool, SentinelConnectionPool):
            return None
        known: set[str] = set()
        answered = False
        for sentinel in pool.sentinel_manager.sentinels:
            try:
                masters = await sentinel.sentinel_masters()
            except REDIS_ERRORS:
                continue
            answered = True
            known.update(str(name.decode() if isinstance(name, bytes) else name) for name in masters)
        return sentinel_refusal(pool.service_name, sorted(known)) if answered else None

    async def probe(self, queues: Sequence[str]) -> None:
        """``/readyz``'s check: ``PING`` and ``EXISTS`` of the first queues' ready sets, in one pipeline
        (on a cluster, ``PING`` of every node first).

        Touching keys, not only the connection, is what shows a server that answers but will not
        serve them (``MOVED`` from a node that became a cluster node).

        :raises StoreError: transient when Redis did not answer; not transient for an error reply.
        """
        with redis_call("probe"):
            if isinstance(self.client, RedisCluster):  # a cluster pipeline takes only commands with keys
                await self.client.ping(target_nodes=RedisCluster.ALL_NODES)
            async with self.client.pipeline(transaction=False) as pipe:
                if not isinstance(self.client, RedisCluster):
                    pipe.ping()
                for queue in list(queues)[:PROBED_QUEUES]:
                    pipe.exists(self.keys.ready(queue))
                await pipe.execute()

    def _tls_address(self) -> tuple[str, int] | None:
        """``(host, port)`` when a standalone client connects with TLS (``rediss://``), else ``None``."""
        if not isinstance(self.client, aioredis.Redis) or isinstance(
            self.client.connection_pool, SentinelConnectionPool
        ):
            return None
        pool = self.client.connection_pool
        if not issubclass(pool.connection_class, aioredis.SSLConnection):
            return None
        kwargs = pool.connection_kwargs
        return str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379))

    # -- pushes ------------------------------------------------------------

    async def push(self, targets: Iterable[PushTarget]) -> int:
        """Push queued tasks into their ready or delayed set in one pipeline.

        One ``ZADD NX`` per queue and set with every member of the batch, not one
        command per task: a bulk enqueue of 1,000 tasks is a handful of commands.

        :param targets: tasks with ``due_at=None`` (ready now) or a due time (delayed).
        :returns: how many ids were pushed (repeats are harmless: ``ZADD NX``).
        :raises StoreError: Redis did not answer; PostgreSQL still has the tasks and the
            reconciler pushes them again.
        """
        ready: dict[str, dict[str, int]] = {}
        delayed: dict[str, dict[str, int]] = {}
        limited: dict[str, dict[str, str]] = {}
        fair: dict[str, list[PushTarget]] = {}
        for t in targets:
            due = None if t.due_at is None else due_ms(t.due_at)
            if due is None and self.fair_args(t.queue) is not None:
                fair.setdefault(t.queue, []).append(t)
                continue
            if due is None:
                ready.setdefault(t.queue, {})[str(t.task_id)] = t.priority
            else:
                delayed.setdefault(t.queue, {})[str(t.task_id)] = delayed_score(due, t.priority)
            if t.limit_keys:
                limited.setdefault(t.queue, {})[str(t.task_id)] = LIMIT_KEY_SEPARATOR.join(t.limit_keys)
        pushed = await self._add(ready, delayed, limited)
        for queue, group in fair.items():
            pushed += await self._push_fair(queue, group)
        return pushed

    async def _push_fair(self, queue: str, targets: Sequence[PushTarget]) -> int:
        """Push ready ids of a queue with fair shares: each waits its key's turn, and the ready set is fed
        (``lua/fair_push.lua``).

        :returns: how many were given.
        :raises StoreError: Redis failed.
        """
        args: list[Any] = [
            self.now_ms() - EPOCH_MS,
            PRIORITY_STEP,
            self.keys.limit_base(queue),
            *(self.fair_args(queue) or [0]),
        ]
        for t in targets:
            args += [str(t.task_id), t.priority, LIMIT_KEY_SEPARATOR.join(t.limit_keys or ())]
        keys = [
            self.keys.ready(queue),
            self.keys.fair_state(queue),
            self.keys.fair_keys(queue),
            self.keys.limit_tasks(queue),
        ]
        with redis_call("push"):
            await self._fair_push(keys=keys, args=args)
        return len(targets)

    async def push_ready(self, ready: Mapping[str, Mapping[str, int]]) -> int:
        """Push tasks runnable now, given as ``{queue: {task id: priority}}``, as :meth:`push` does.

        A bulk enqueue prepares this while PostgreSQL copies its rows, so the push after the
        commit only scores and sends.

        :returns: how many ids were pushed.
        :raises StoreError: Redis did not answer.
        """
        return await self._add(ready, {})

    async def _add(
        self,
        ready: Mapping[str, Mapping[str, int]],
        delayed: Mapping[str, Mapping[str, int]],
        limited: Mapping[str, Mapping[str, str]] | None = None,
    ) -> int:
        """``ZADD NX`` ready members (``{queue: {id: priority}}``) and delayed ones (``{queue: {id: score}}``).

        The limit keys of limited tasks (``{queue: {id: keys, one per line}}``) are written first, in
        the same pipeline, so that no fetcher pops such an id before the admission can see its keys.

        :returns: how many members were given.
        :raises StoreError: Redis did not answer.
        """
        now = self.now_ms()
        sets: list[tuple[str, Mapping[str, int]]] = []
        for queue, members in ready.items():
            step = self.priority_step(queue)
            # a ready task's score depends on its priority only: one per priority and batch
            scores = {p: ready_score(p, now, step) for p in set(members.values())}
            sets.append((self.keys.ready(queue), {m: scores[p] for m, p in members.items()}))
        sets += [(self.keys.delayed(q), m) for q, m in delayed.items()]
        sets = [(key, members) for key, members in sets if members]
        n = sum(len(m) for _, m in sets)
        if not n:
            return 0
        with redis_call("push"):
            if limited:
                async with self.client.pipeline(transaction=False) as pipe:
                    for queue, entries in limited.items():
                        pipe.hset(self.keys.limit_tasks(queue), mapping={k: v for k, v in entries.items()})
                    for key, members in sets:
                        pipe.zadd(key, members, nx=True)
                    await pipe.execute()
                return n
            if len(sets) == 1:  # one command: no pipeline (a single enqueue starts sooner)
                await self.client.zadd(sets[0][0], sets[0][1], nx=True)
                return n
            async with self.client.pipeline(transaction=False) as pipe:
                for key, members in sets:
                    pipe.zadd(key, members, nx=True)
                await pipe.execute()
        return n

    async def push_ready_or_delayed(self, targets: Iterable[PushTarget]) -> int:
        """Like :meth:`push`, but a target whose due time has passed goes to ready."""
        cutoff = self.now_ms()
        fixed = []
        for t in targets:
            due = None if t.due_at is None else due_ms(t.due_at)
            fixed.append(
                t
                if due is not None and due > cutoff
                else PushTarget(t.task_id, t.queue, t.priority, None, t.limit_keys)
            )
        return await self.push(fixed)

    async def absent(self, targets: Sequence[PushTarget]) -> list[PushTarget]:
        """The targets whose id is in neither the ready nor the delayed set of its queue, nor parked under
        one of its limit keys.

        One pipelined round trip: one ``ZMSCORE`` per queue and set, not one command
        per id (a resync checks whole backlogs). The caller pushes what it still wants
        pushed (:meth:`push_ready_or_delayed`, ``ZADD NX``: a race with a concurrent push
        is harmless).

        :returns: the absent targets, in their given order within each queue.
        """
        if not targets:
            return []
        by_queue: dict[str, list[PushTarget]] = {}
        for t in targets:
            by_queue.setdefault(t.queue, []).append(t)
        with redis_call("absent"):
            async with self.client.pipeline(transaction=False) as pipe:
                for queue, group in by_queue.items():
                    ids = [str(t.task_id) for t in group]
                    pipe.zmscore(self.keys.ready(queue), ids)
                    pipe.zmscore(self.keys.delayed(queue), ids)
                scores = await pipe.execute()
        missing: list[PushTarget] = []
        for i, group in enumerate(by_queue.values()):
            in_ready, in_delayed = scores[2 * i], scores[2 * i + 1]
            missing.extend(t for t, r, d in zip(group, in_ready, in_delayed, strict=True) if r is None and d is None)
        limited = [t for t in missing if t.limit_keys]
        if not limited:
            return missing
        with redis_call("absent"):
            async with self.client.pipeline(transaction=False) as pipe:
                for t in limited:
                    base = self.keys.limit_base(t.queue)
                    for lk in t.limit_keys or ():
                        pipe.zscore(f"{base}parked:{lk}", str(t.task_id))
                found = iter(await pipe.execute())
        parked: set[uuid.UUID] = set()
        for t in limited:
            scores = [next(found) for _ in t.limit_keys or ()]  # one per key, in the order asked
            if any(score is not None for score in scores):
                parked.add(t.task_id)
        return [t for t in missing if t.task_id not in parked]

    async def dead_letter(self, queue: str, task_ids: Sequence[str]) -> None:
        """Mirror dead-lettered tasks into the queue's DLQ set, scored now; it keeps the oldest
        :data:`DLQ_MIRROR_MAX`. Two commands however many ids, each O(log n) per id."""
        if not task_ids:
            return
        now = self.now_ms()
        key = self.keys.dlq(queue)
        with redis_call("dead_letter"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zadd(key, dict.fromkeys(task_ids, now), nx=True)
                pipe.zremrangebyrank(key, DLQ_MIRROR_MAX, -1)
                await pipe.execute()

    async def replay(self, queue: str, items: Sequence[tuple[str, int]]) -> None:
        """Take replayed tasks out of the DLQ mirror and push them ready.

        :param items: ``(task_id, priority)`` pairs.
        """
        if not items:
            return
        now = self.now_ms()
        step = self.priority_step(queue)
        with redis_call("replay"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zrem(self.keys.dlq(queue), *(tid for tid, _ in items))
                for tid, priority in items:
                    pipe.zadd(self.keys.ready(queue), {tid: ready_score(priority, now, step)}, nx=True)
                await pipe.execute()

    async def forget(self, queue: str, task_id: str) -> None:
        """Remove a task id from every structure of its queue (a cancelled task)."""
        await self.forget_many([(queue, task_id)])

    async def forget_many(self, items: Sequence[tuple[str, str]]) -> None:
        """Remove each ``(queue, task_id)`` from every structure of its queue, in one pipeline."""
        if not items:
            return
        with redis_call("forget"):
            async with self.client.pipeline(transaction=False) as pipe:
                for queue, task_id in items:
                    pipe.zrem(self.keys.ready(queue), task_id)
                    pipe.zrem(self.keys.delayed(queue), task_id)
                    pipe.hdel(self.keys.priorities(queue), task_id)
                    pipe.zrem(self.keys.dlq(queue), task_id)
                await pipe.execute()

    # -- pops and moves ------------------------------------------------------

    async def pop_ready(self, queue: str, count: int, block_seconds: float) -> list[str]:
        """Pop up to ``count`` ids from a queue's ready set, best score first (:meth:`pop_with_scores` without
        scores)."""
        return (await self.pop_with_scores(queue, count, block_seconds))[0]

    async def pop_scored(self, queue: str, count: int, block_seconds: float) -> list[tuple[str, float]]:
        """Pop up to ``count`` ids from a queue's ready set, best score first, each with its score as a float
        (:meth:`pop_with_scores`, paired).

        :returns: the popped ``(task id, score)`` pairs (empty after a timeout).
        """
        ids, scores = await self.pop_with_scores(queue, count, block_seconds)
        return [(task_id, float(score)) for task_id, score in zip(ids, scores, strict=True)]

    async def pop_with_scores(
        self, queue: str, count: int, block_seconds: float
    ) -> tuple[list[str], list[bytes | float]]:
        """Pop up to ``count`` ids from a queue's ready set, best score first.

        Blocks up to ``block_seconds`` when the set is empty (``BZMPOP``; the wait is
        server-side, so it is an argument rather than a client timeout). Members that
        are not task ids are set aside (see module docs).

        :returns: the popped ids (empty after a timeout) and, in the same order, their scores as the
            reply holds them (bytes over RESP2, floats over RESP3): ``float()`` reads one. Only the
            admission needs them: a fetch of a queue without (no limit, no fair shares) leaves them unread.
        """
        with redis_call("pop_ready"):
            reply: Any = await self.client.bzmpop(block_seconds, 1, [self.keys.ready(queue)], min=True, count=count)
        if not reply:
            return [], []
        ids: list[str] = []
        scores: list[bytes | float] = []
        foreign: list[bytes] = []
        for member in reply[1]:
            raw, score = (member[0], member[1]) if isinstance(member, list | tuple) else (member, 0.0)
            text = _text(raw)
            if text is None:
                foreign.append(raw if isinstance(raw, bytes) else str(raw).encode())
            else:
                ids.append(text)
                scores.append(score)
        if foreign:
            await self._set_aside(queue, self.keys.ready(queue), foreign)
        return ids, scores

    async def _set_aside(self, queue: str, key: str, members: Sequence[bytes]) -> None:
        """Keep members taskmesh did not write in the queue's ``foreign`` list, and say so."""
        now = time.monotonic()
        if now - self._foreign_logged.get(key, -FOREIGN_LOG_EVERY_SECONDS) >= FOREIGN_LOG_EVERY_SECONDS:
            self._foreign_logged[key] = now
            log.warning(
                "redis_foreign_member",
                key=key,
                count=len(members),
                sample=repr(members[0][:64]),
                kept_in=self.keys.foreign(queue),
            )
        with redis_call("set_aside"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.lpush(self.keys.foreign(queue), *members)
                pipe.ltrim(self.keys.foreign(queue), 0, FOREIGN_KEPT - 1)
                await pipe.execute()

    async def move_due(self, queue: str, limit: int = 1000, limits: LimitArgs = (0,)) -> tuple[int, float | None]:
        """Run ``delayed_move.lua`` once for ``queue``: due ids go to ready with their priority, and the limit
        keys whose time came move back what may start of their parked ids.

        :param limits: the limits in force (``LimitBook.script_args``; a limit not among them holds nothing).
        :returns: ``(ids moved, in how many seconds the earliest limit key with parked ids is to be looked
            at again)``, the latter ``None`` when no id is parked.
        """
        with redis_call("move_due"):
            moved, soonest = await self._move(
                keys=[
                    self.keys.delayed(queue),
                    self.keys.ready(queue),
                    self.keys.priorities(queue),
                    self.keys.limit_wake(queue),
                    self.keys.limit_tasks(queue),
                    self.keys.fair_state(queue),
                    self.keys.fair_keys(queue),
                ],
                args=[
                    self.now_ms(),
                    limit,
                    EPOCH_MS,
                    self.priority_step(queue),
                    DELAYED_PRIORITY_SLOTS,
                    LEGACY_DELAYED_SCORE_MAX,
                    self.keys.limit_base(queue),
                    *limits,
                    *(self.fair_args(queue) or [0]),
                ],
            )
        return int(moved), int(soonest) / 1000 if int(soonest) >= 0 else None

    # -- the DLQ mirror, health ----------------------------------------------

    async def rewrite_dlq(self, queue: str, failed: Sequence[tuple[str, int]]) -> bool:
        """Make the DLQ mirror of ``queue`` hold exactly ``failed`` and delete the list of earlier versions.

        :param failed: ``(task_id, failed_at_ms)``, oldest first (at most :data:`DLQ_MIRROR_MAX`).
        :returns: whether it had to change (the members differed, or the old list was there).

        Members that are not task ids are set aside first.
        """
        key, legacy = self.keys.dlq(queue), self.keys.legacy_dlq(queue)
        with redis_call("rewrite_dlq"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zrange(key, 0, -1)
                pipe.exists(legacy)
                current, had_legacy = await pipe.execute()
        decoded = [_text(m) for m in current]
        if not had_legacy and set(decoded) == {tid for tid, _ in failed} and len(decoded) == len(failed):
            return False
        foreign = [
            m if isinstance(m, bytes) else str(m).encode() for m, d in zip(current, decoded, strict=True) if d is None
        ]
        if foreign:
            await self._set_aside(queue, key, foreign)
        with redis_call("rewrite_dlq"):
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(key, legacy)
                if failed:
                    pipe.zadd(key, dict(failed))
                await pipe.execute()
        return True

    async def identity(self, queues: Sequence[str]) -> dict[str, tuple[str, bool]]:
        """``{queue: (run_id, marker_present)}`` for the node that holds each queue's keys.

        A new run_id means that node restarted or another took its place (a failover); a
        missing marker (``{prefix}:{queue}:marker``, in the queue's own slot) means the queue's
        keys were lost (a flush, a restart without persistence). On a cluster, each node owning
        one of the queues is asked once.
        """
        if not queues:
            return {}
        with redis_call("identity"):
            async with self.client.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.exists(self.keys.marker(queue))
                markers = await pipe.execute()
            if isinstance(self.client, RedisCluster):
                owners = {q: self.client.get_node_from_key(self.keys.marker(q)) for q in queues}
                run_ids: dict[str, str] = {}
                for node in {n.name: n for n in owners.values() if n is not None}.values():
                    run_ids[node.name] = _run_id(await self.client.info("server", target_nodes=node))
                runs = [run_ids.get(n.name, "") if n is not None else "" for n in owners.values()]
            else:
                runs = [_run_id(await self.client.info("server"))] * len(queues)
        return {q: (run, bool(marker)) for q, run, marker in zip(queues, runs, markers, strict=True)}

    async def set_marker(self, queue: str, value: str) -> None:
        """Write the marker whose disappearance tells the reconciler ``queue``'s keys were lost."""
        with redis_call("set_marker"):
            await self.client.set(self.keys.marker(queue), value)

    async def depths(self, queue: str) -> tuple[int, int, int]:
        """``(ready, delayed, dlq)`` lengths of one queue."""
        with redis_call("depths"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zcard(self.keys.ready(queue))
                pipe.zcard(self.keys.delayed(queue))
                pipe.zcard(self.keys.dlq(queue))
                ready, delayed, dlq = await pipe.execute()
        return int(ready), int(delayed), int(dlq)

    async def sizes(self, queues: Sequence[str]) -> dict[str, tuple[int, int]]:
        """``{queue: (ready, delayed)}`` in one pipeline (the sampler's read)."""
        with redis_call("sizes"):
            async with self.client.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.zcard(self.keys.ready(queue))
                    pipe.zcard(self.keys.delayed(queue))
                found = await pipe.execute()
        return {q: (int(found[2 * i]), int(found[2 * i + 1])) for i, q in enumerate(queues)}
