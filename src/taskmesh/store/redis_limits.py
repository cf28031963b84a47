"""Coordination in Redis that is not dispatch: singleton locks, GCRA rate limits and the task limits'
admission, shared by every instance.

The services that one instance at a time should run (the delayed mover per queue, the
reconciler's sweeps, retention) take a short lock (``SET NX PX``, released by a script only by
its holder); a lock only saves work, it never guards correctness (docs/internals/design.md
principle 5). A rate limit is a GCRA bucket (``lua/rate_limit.lua``) on Redis's clock: one
script call decides ``cost`` requests, so every instance draws from one bucket. The API's
rate limits and the tenants' enqueue quotas use it.

The **admission** of a queue's popped ids under the task limits (``limits/``) is one script call
per fetch batch (``lua/limits_admit.lua``), on Redis's clock too (one clock for every instance's
decisions; ``lua/limits_lib.lua``): an id whose limit keys all have room takes a slot of
each (a sorted set of task ids scored by the run's lease end: a lost run's slot lapses with its
lease) and a rate's interval (GCRA, as above, in milliseconds); any other is **parked** under the
key it waits for, out of the ready set, so no fetcher meets it again until that key has room. A
run's end gives its slots back and moves back to ready what may start of the freed keys' parked
ids, in the same call (``lua/limits_release.lua``); the delayed mover looks at keys whose time
came (a rate's next start, a back-off's end, the earliest lease end). Every key of a queue's
limits carries the queue's hash tag: one cluster slot, so a limit over tasks of several queues is
counted in each queue apart.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskmesh.store.classify import redis_call
from taskmesh.store.keys import PRIORITY_STEP, Keys
from taskmesh.store.redis_types import RedisClient
from taskmesh.store.scripts import lua

LimitArgs = Sequence[str | int | float]
"""The limits in force as the scripts read them (``LimitBook.script_args``)."""
FairArgs = Sequence[str | int | float]
"""A queue's fair shares as the scripts read them (``LimitBook.fair_args``)."""
SEPARATOR = "\n"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class Admission:
    """What the admission of one fetch batch decided.

    :param started: ids that may be claimed, in pop order, each with the limit keys whose slots it took
        (empty: it holds none).
    :param parked: ids parked, each with the limit key it waits for.
    :param standby: ids to claim ahead, each with the full limit key it waits for (``limits/standby.py``).
    :param until_ms: the lease end the started ids' slots hold (ms since the epoch).
    """

    started: list[tuple[str, list[str]]] = field(default_factory=list)
    parked: list[tuple[str, str]] = field(default_factory=list)
    standby: list[tuple[str, str]] = field(default_factory=list)
    until_ms: int = 0


@dataclass(frozen=True, slots=True)
class Handoff:
    """A slot handed from a run that ended to a run claimed ahead of its full key (``limits/standby.py``).

    :param limit_key: the key whose slot it is.
    :param ended_id: the task whose run ended.
    :param fence: that run's slot's lease end as this instance last set it (ms; 0: whatever it is).
    :param task_id: the task that now holds the slot.
    """

    limit_key: str
    ended_id: str
    fence: int
    task_id: str


@dataclass(frozen=True, slots=True)
class HandedOver:
    """What ``RedisLimits.hand_over`` did.

    :param until_ms: the lease end of the slots handed or taken (ms since the epoch).
    :param started: ids claimed ahead that took a slot and may start now.
    :param backing_off: ``{limit key: until ms}`` of the keys looked at that back off (a ``RateLimited``).
    :param stop: ``{limit key: whether no slot of it may be handed over}`` of the keys looked at (its limit was
        lowered below the slots held, or given a rate, at run time).
    """

    until_ms: int
    started: list[str]
    backing_off: dict[str, int]
    stop: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Release:
    """One run's (or one refused claim's) slots to give back.

    :param task_id: the task whose slots they are.
    :param limit_keys: every limit key it holds.
    :param back_off: the keys to hold back until ``until_ms`` (a handler's ``RateLimited``).
    :param until_ms: when they may start again, ms since the epoch (0: no back-off).
    :param ended: the task is over: its limit keys are forgotten.
    :param fence: give a slot back only while its lease end is this one (ms; 0: whatever it is): the last
        one this instance gave it, so that a late result never takes a newer run's slot.
    """

    task_id: str
    limit_keys: Sequence[str]
    back_off: Sequence[str] = ()
    until_ms: int = 0
    ended: bool = False
    fence: int = 0


class RedisLimits:
    """Locks and rate limits in the deployment's Redis (see module docs).

    :param client: the store's redis-py asyncio client (bytes replies).
    :param keys: the deployment's key builder.
    """

    def __init__(self, client: RedisClient, keys: Keys, *, now_ms: Callable[[], int] = _wall_ms) -> None:
        self.client = client
        self.keys = keys
        self.now_ms = now_ms
        self._release = client.register_script(lua("lock_release"))
        self._rate = client.register_script(lua("rate_limit"))
        self._admit = client.register_script(lua("limits_lib") + lua("fair_lib") + lua("limits_admit"))
        self._give_back = client.register_script(lua("limits_lib") + lua("fair_lib") + lua("limits_release"))
        self._standby = client.register_script(lua("limits_lib") + lua("limits_standby"))

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

    # -- the admission of task limits -------------------------------------------

    async def admit(
        self,
        queue: str,
        popped: Sequence[tuple[str, float]],
        limits: LimitArgs,
        lease_ms: int,
        *,
        fair: FairArgs | None = None,
        batch: int = 0,
        step: int = PRIORITY_STEP,
        ahead: int = 0,
        depth: float = 0.0,
        standing: Mapping[str, int] | None = None,
    ) -> Admission:
        """Decide which popped ids may start (``lua/limits_admit.lua``; see module docs).

        :param popped: ``(task id, ready score)`` as popped, best first.
        :param limits: the limits in force (``LimitBook.script_args``).
        :param lease_ms: how long a slot holds unless its run's heartbeat extends it.
        :param fair: the queue's fair shares (``LimitBook.fair_args``), ``None`` without; then the popped
            ids only count how many may start, which ids start is the keys' turns', and the ready set is
            fed to ``batch`` ids (``lua/fair_lib.lua``). The started ids need not be among those popped.
        :param step: the queue's ready-score step between priorities (``LimitBook.priority_step``).
        :param ahead: how many more ids the fetcher may claim ahead of a full key (``limits/standby.py``).
        :param depth: how far ahead it claims, in runs per executor (its prefetch over its executors): it holds
            at most a key's slots times this (at least one) of the key's ids so.
        :param standing: ``{limit key: ids of it the fetcher holds claimed ahead}``.
        :raises StoreError: Redis failed; nothing was decided (the popped ids are still queued in
            PostgreSQL, and the reconciler pushes them again).
        """
        held = dict(standing or {})
        args: list[Any] = [lease_ms, self.keys.limit_base(queue), batch, step, ahead, depth, len(held)]
        for key, n in held.items():
            args += [key, n]
        args += [*limits, *(fair or [0])]
        for task_id, score in popped:
            args += [task_id, f"{score:.3f}"]
        keys = [
            self.keys.ready(queue),
            self.keys.limit_tasks(queue),
            self.keys.limit_wake(queue),
            self.keys.marker(queue),
            self.keys.fair_state(queue),
            self.keys.fair_keys(queue),
        ]
        with redis_call("limits_admit"):
            reply = await self._admit(keys=keys, args=args)
        out = Admission(until_ms=int(_text(reply[-1])))
        for i in range(0, len(reply) - 1, 2):
            task_id, verdict = _text(reply[i]), _text(reply[i + 1])
            if verdict.startswith("!"):
                out.parked.append((task_id, verdict[1:]))
            elif verdict.startswith("~"):
                out.standby.append((task_id, verdict[1:]))
            else:
                out.started.append((task_id, verdict.split(SEPARATOR) if verdict else []))
        return out

    async def release(
        self, queue: str, runs: Iterable[Release], limits: LimitArgs, *, fair: FairArgs | None = None
    ) -> int:
        """Give slots back and move back to ready what may start of the freed keys' parked ids
        (``lua/limits_release.lua``); in a queue with fair shares (``fair``, as :meth:`admit`) a fairness
        key's slot given back moves its key up in the turns.

        :returns: parked ids moved back to ready.
        :raises StoreError: Redis failed; the slots lapse with their runs' leases.
        """
        args: list[Any] = [self.keys.limit_base(queue), *limits, *(fair or [0])]
        n = 0
        for run in runs:
            args += [
                run.task_id,
                SEPARATOR.join(run.limit_keys),
                SEPARATOR.join(run.back_off),
                run.until_ms,
                1 if run.ended else 0,
                run.fence,
            ]
            n += 1
        if not n:
            return 0
        keys = [
            self.keys.ready(queue),
            self.keys.limit_tasks(queue),
            self.keys.limit_wake(queue),
            self.keys.fair_keys(queue),
            self.keys.fair_state(queue),
        ]
        with redis_call("limits_release"):
            return int(await self._give_back(keys=keys, args=args))

    async def hand_over(
        self,
        queue: str,
        handoffs: Sequence[Handoff],
        waiting: Sequence[tuple[str, str]],
        limits: LimitArgs,
        lease_ms: int,
    ) -> HandedOver:
        """Rename the slots handed from ended runs to runs claimed ahead, and start those claimed ahead whose
        key has room now (``lua/limits_standby.lua``; ``limits/standby.py``).

        :param waiting: ``(task id, limit key)`` of the ids claimed ahead that wait.
        :param limits: the limits in force (``LimitBook.script_args``).
        :param lease_ms: how long the slots handed or taken hold unless a heartbeat extends them.
        :raises StoreError: Redis failed: the slots handed stay the ended runs' until their leases end.
        """
        args: list[Any] = [lease_ms, self.keys.limit_base(queue), *limits, len(handoffs)]
        for h in handoffs:
            args += [h.limit_key, h.ended_id, h.fence, h.task_id]
        args.append(len(waiting))
        for task_id, key in waiting:
            args += [task_id, key]
        with redis_call("limits_standby"):
            reply = await self._standby(keys=[self.keys.ready(queue), self.keys.limit_wake(queue)], args=args)
        n = int(reply[1])
        started = [_text(r) for r in reply[2 : 2 + n]]
        at = 2 + n
        b = int(reply[at])
        backing = {_text(reply[at + 1 + 2 * i]): int(_text(reply[at + 2 + 2 * i])) for i in range(b)}
        at += 1 + 2 * b
        k = int(reply[at])
        stop = {_text(reply[at + 1 + 2 * i]): int(reply[at + 2 + 2 * i]) == 1 for i in range(k)}
        return HandedOver(until_ms=int(_text(reply[0])), started=started, backing_off=backing, stop=stop)

    async def hold(self, queue: str, runs: Sequence[tuple[uuid.UUID | str, Sequence[str]]], until_ms: int) -> None:
        """Keep the slots of runs that still run until ``until_ms`` (the heartbeat; ``ZADD XX``: a slot that
        lapsed stays lapsed, as its run's lease did). Each run is ``(task id, its limit keys)``.

        :raises StoreError: Redis failed.
        """
        if not runs:
            return
        base = self.keys.limit_base(queue)
        with redis_call("limits_hold"):
            async with self.client.pipeline(transaction=False) as pipe:
                for task_id, limit_keys in runs:
                    for lk in limit_keys:
                        pipe.zadd(f"{base}slots:{lk}", {str(task_id): until_ms}, xx=True)
                await pipe.execute()

    async def restore(self, queue: str, runs: Sequence[tuple[uuid.UUID | str, Sequence[str], int]]) -> None:
        """Give running tasks their slots again after Redis lost them (a flush, a failover), each
        ``(task id, its limit keys, its lease end in ms)``, from PostgreSQL's running rows.

        :raises StoreError: Redis failed.
        """
        if not runs:
            return
        base = self.keys.limit_base(queue)
        names = [lk.partition(":")[0] for _, keys, _ in runs for lk in keys]
        with redis_call("limits_restore"):
            async with self.client.pipeline(transaction=False) as pipe:
                for task_id, limit_keys, until_ms in runs:
                    for lk in limit_keys:
                        pipe.zadd(f"{base}slots:{lk}", {str(task_id): until_ms})
                added = await pipe.execute()
            counts: dict[str, int] = {}
            for name, n in zip(names, added, strict=True):
                counts[name] = counts.get(name, 0) + int(n)
            async with self.client.pipeline(transaction=False) as pipe:
                for name, n in counts.items():
                    if n and not name.startswith("@"):  # a fairness key's slots are no limit's
                        pipe.hincrby(f"{base}inuse", name, n)
                await pipe.execute()

    async def gauges(self, queue: str) -> dict[str, tuple[int, int]]:
        """``{limit name: (slots held, ids parked)}`` over every key of each limit in ``queue`` (the metrics).

        :raises StoreError: Redis failed.
        """
        base = self.keys.limit_base(queue)
        with redis_call("limits_gauges"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hgetall(f"{base}inuse")
                pipe.zrange(self.keys.limit_wake(queue), 0, -1)
                held, waiting = await pipe.execute()
            keys = [_text(k) for k in waiting]
            async with self.client.pipeline(transaction=False) as pipe:
                for lk in keys:
                    pipe.zcard(f"{base}parked:{lk}")
                parked = await pipe.execute() if keys else []
        out: dict[str, tuple[int, int]] = {_text(n): (max(0, int(v)), 0) for n, v in held.items()}
        for lk, n in zip(keys, parked, strict=True):
            name = lk.partition(":")[0]
            in_use, waits = out.get(name, (0, 0))
            out[name] = (in_use, waits + int(n))
        return out

    async def parked_count(self, queue: str) -> int:
        """How many ids of ``queue`` are parked: under a limit key (every one with parked ids is in its wake
        set), or waiting their fairness key's turn (every such key is in the fair keys set).

        :raises StoreError: Redis failed.
        """
        base = self.keys.limit_base(queue)
        with redis_call("limits_parked"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zrange(self.keys.limit_wake(queue), 0, -1)
                pipe.zrange(self.keys.fair_keys(queue), 0, -1)
                limited, fair = await pipe.execute()
            waiting = [_text(k) for k in limited] + ["@" + _text(k) for k in fair]
            if not waiting:
                return 0
            async with self.client.pipeline(transaction=False) as pipe:
                for lk in waiting:
                    pipe.zcard(f"{base}parked:{lk}")
                counts = await pipe.execute()
        return sum(int(c) for c in counts)

    async def in_use(self, queue: str, limit_keys: Sequence[str]) -> dict[str, tuple[int, int, int | None]]:
        """``{limit key: (slots held, ids parked, backing off until ms or None)}`` of ``queue``; slots of
        lost runs whose lease ended are not counted.

        :raises StoreError: Redis failed.
        """
        if not limit_keys:
            return {}
        base = self.keys.limit_base(queue)
        now = self.now_ms()
        with redis_call("limits_in_use"):
            async with self.client.pipeline(transaction=False) as pipe:
                for lk in limit_keys:
                    pipe.zcount(f"{base}slots:{lk}", now, "+inf")
                    pipe.zcard(f"{base}parked:{lk}")
                    pipe.get(f"{base}backoff:{lk}")
                found = await pipe.execute()
        out: dict[str, tuple[int, int, int | None]] = {}
        for i, lk in enumerate(limit_keys):
            until = found[3 * i + 2]
            until_ms = int(float(until)) if until is not None else None
            out[lk] = (int(found[3 * i]), int(found[3 * i + 1]), until_ms if until_ms and until_ms > now else None)
        return out

    async def waiting_keys(self, queue: str, prefix: str, most: int) -> list[str]:
        """The limit keys of ``queue`` starting with ``prefix`` that have ids parked, at most ``most``
        (in the order their next look comes).

        :raises StoreError: Redis failed.
        """
        with redis_call("limits_waiting_keys"):
            found = await self.client.zrange(self.keys.limit_wake(queue), 0, -1)
        keys = [_text(k) for k in found]  # type: ignore[arg-type]  # bytes without WITHSCORES
        return [k for k in keys if k.startswith(prefix)][:most]

    async def parked_under(self, queue: str, task_id: str, limit_keys: Sequence[str]) -> str | None:
        """The limit key ``task_id`` is parked under, if any (``blocked_by`` of a task).

        :raises StoreError: Redis failed.
        """
        if not limit_keys:
            return None
        base = self.keys.limit_base(queue)
        with redis_call("limits_parked_under"):
            async with self.client.pipeline(transaction=False) as pipe:
                for lk in limit_keys:
                    pipe.zscore(f"{base}parked:{lk}", task_id)
                scores = await pipe.execute()
        return next((lk for lk, score in zip(limit_keys, scores, strict=True) if score is not None), None)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
