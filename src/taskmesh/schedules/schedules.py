"""Cron schedules over the stores: sync from config, fire what is due, and the operator's verbs.

Exactly one task per fire, however many instances run:

1. Each instance upserts its ``[[schedules]]`` into the ``schedules`` table at
   start (:meth:`Schedules.sync`); a changed declaration (its hash differs)
   resets the pause and the next fire, an unchanged one keeps both.
2. :meth:`Schedules.fire_due` locks the due rows ``FOR UPDATE SKIP LOCKED``
   (one instance per row at a time), works out the fire times due since the
   row's ``next_fire_at``, applies the misfire and overlap policies, enqueues
   one task per fire with the idempotency key ``cron:{name}:{fire UTC}``, and
   advances the row. The tasks commit before the row: an instance dying in
   between leaves the row due, and the next one's enqueue of the same fires is
   answered by the unique key instead of making a second task.

Misfires: a fire enqueued more than ``misfire_grace_seconds`` after its time is
a misfire; ``skip`` drops them, ``once`` makes only the most recent, ``all``
makes every one (the most recent 1,000, with a warning beyond). Counted in
``taskmesh_schedule_fires_total{schedule,outcome}`` with outcomes ``fired``,
``misfire_fired``, ``misfire_skipped``, ``overlap_skipped``, ``triggered`` and
``duplicate`` (the key already had a task).
"""

from __future__ import annotations

import functools
import math
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import chain
from typing import Any

import anyio
from pydantic import ValidationError

from taskmesh.config import MISFIRE_ALL_CAP, ScheduleSettings
from taskmesh.errors import CronSpecError, InvalidTaskError, ScheduleNotFoundError
from taskmesh.observability.logs import get_logger
from taskmesh.schedules.cron import CronSpec
from taskmesh.security import audit
from taskmesh.security.tenancy import EVERYTHING, Reach
from taskmesh.store import PgStore
from taskmesh.tasks.models import PushTarget
from taskmesh.tasks.records import json_value
from taskmesh.tasks.states import TaskStatus, TaskType
from taskmesh.tasks.tasks import Tasks
from taskmesh.tasks.validation import TaskSpec, dump_json

log = get_logger("taskmesh.scheduler")

NOTIFY_CHANNEL = "taskmesh_schedules"
"""PostgreSQL channel notified on sync, pause and resume, so sleeping schedulers re-read at once."""
ENUMERATION_LIMIT = 20_000
"""Due fire times walked one by one after an outage before the rest is estimated (see plan_fires)."""
NEXT_FIRES_SHOWN = 5
FIRE_LOCK_TIMEOUT_MS = 2000
"""A fire waits at most this long for a row lock (SKIP LOCKED skips held rows; this bounds the rest)."""
FIRE_IDLE_TIMEOUT_MIN_MS = 1000
FIRE_IDLE_TIMEOUT_MAX_MS = 5000
"""Bounds of the fire transaction's ``idle_in_transaction_session_timeout`` (:func:`fire_idle_timeout_ms`)."""

__all__ = [
    "Fire",
    "ScheduleNotFoundError",
    "Schedules",
    "fire_idle_timeout_ms",
    "fire_key",
    "plan_fires",
    "schedule_to_dict",
]


@dataclass(frozen=True, slots=True)
class Fire:
    """What happened to one fire time: ``outcome`` as in the module docs; ``task_id`` when a task answers it."""

    schedule: str
    fire_at: datetime
    outcome: str
    task_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class _Plan:
    """A due row's fires as :func:`plan_fires` worked them out, and the row's values they follow from."""

    name: str
    values: tuple[Any, ...]
    spec: CronSpec
    fires: list[tuple[datetime, bool]]
    skipped: int


def fire_key(name: str, fire_at: datetime) -> str:
    """The idempotency key of a fire: ``cron:{name}:{UTC ISO 8601, whole seconds}Z``."""
    return f"cron:{name}:{fire_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S}Z"


def fire_idle_timeout_ms(graces: Iterable[float]) -> int:
    """How long a fire transaction may sit silent before PostgreSQL ends it: a quarter of the shortest
    misfire grace, clamped to 1 to 5 s.

    When the firing instance goes silent mid-transaction (cut off from PostgreSQL, frozen),
    PostgreSQL ends its session after this long and releases the due rows it locked. Another
    scheduler, which found them locked, looks again within a second
    (``services.scheduler.LOCKED_RETRY_SECONDS``) and fires those slots inside their grace
    instead of skipping them as misfires: the timeout plus that second stays inside any grace
    over 2 s. The floor keeps a healthy instance's short pauses (a busy event loop) from
    ending its fires, so a grace of 2 s or less can still lose the slot a silent holder took.

    :param graces: ``misfire_grace_seconds`` of the schedules the transaction may lock.
    :returns: milliseconds (:data:`FIRE_IDLE_TIMEOUT_MAX_MS` when ``graces`` is empty).
    """
    quarter = min(graces, default=math.inf) * 1000 / 4
    return int(min(max(quarter, FIRE_IDLE_TIMEOUT_MIN_MS), FIRE_IDLE_TIMEOUT_MAX_MS))


@lru_cache(maxsize=256)
def _spec(cron: str, timezone: str) -> CronSpec:
    return CronSpec(cron, timezone)


def _moment(spec: CronSpec, instant: datetime) -> dict[str, str]:
    return {
        "utc": instant.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "local": spec.local(instant).isoformat(),
    }


def schedule_to_dict(row: Any, now: datetime | None = None) -> dict[str, Any]:
    """A ``schedules`` row in the API's shape, with its next five fires in UTC and local time.

    ``state`` is ``active``, ``paused``, ``disabled``, or ``overdue``: active but
    its next fire passed more than the grace period ago, so no scheduler is
    firing it (none runs, or none declares it any more); when one does again,
    the misfire policy decides about the missed times. A row this version
    cannot read (an unknown zone) is listed with ``error`` and no fires.
    """
    now = now or datetime.now(UTC)
    upcoming: list[dict[str, str]] = []
    error: str | None = None
    nxt = row["next_fire_at"]
    active = row["enabled"] and not row["paused"]
    state = "active" if active else ("paused" if row["enabled"] else "disabled")
    if active and nxt is not None and now - nxt > timedelta(seconds=row["misfire_grace_seconds"]):
        state = "overdue"
    try:
        spec = _spec(row["cron"], row["timezone"])
    except CronSpecError as exc:
        spec, error = None, str(exc)
    if spec is not None and active and nxt is not None:
        for _ in range(NEXT_FIRES_SHOWN):
            upcoming.append(_moment(spec, nxt))
            nxt = spec.next_fire(nxt)
    return {
        "name": row["name"],
        "cron": row["cron"],
        "timezone": row["timezone"],
        "task": row["task"],
        "queue": row["queue"],
        "priority": row["priority"],
        "payload": json_value(row["payload"]),
        "max_retries": row["max_retries"],
        "misfire": row["misfire"],
        "misfire_grace_seconds": row["misfire_grace_seconds"],
        "overlap": row["overlap"],
        "tenant_id": row["tenant_id"],
        "enabled": row["enabled"],
        "paused": row["paused"],
        "state": state,
        "last_fire": _last_fire(spec, row["last_fire_at"]),
        "next_fires": upcoming,
        "last_task_id": str(row["last_task_id"]) if row["last_task_id"] else None,
        "synced_at": row["synced_at"].isoformat(),
        "error": error,
    }


def _last_fire(spec: CronSpec | None, last: datetime | None) -> dict[str, str | None] | None:
    if last is None:
        return None
    if spec is None:
        return {"utc": _iso(last), "local": None}
    return dict(_moment(spec, last))


def plan_fires(
    spec: CronSpec, first: datetime, now: datetime, *, policy: str, grace_seconds: float
) -> tuple[list[tuple[datetime, bool]], int]:
    """Decide which due fire times to make, by the misfire policy (pure).

    A due fire is *on time* when ``now - fire <= grace``; on-time fires are made
    under every policy. Late ones (misfires): ``skip`` drops them, ``once``
    makes the most recent one when no fire is on time, ``all`` makes them (the
    most recent 1,000 with the on-time ones).

    CPU-bound for long outages of frequent specs (about 33 µs a fire): callers
    run it in a worker thread. Past 20,000 due fires the count of the older
    ones is estimated from their average period, and only the tail (the last
    1,000 fires or the grace period, whichever is longer) is walked exactly.

    :param first: the row's ``next_fire_at``, itself a fire time, ``<= now``.
    :param policy: ``skip``, ``once`` or ``all``.
    :param grace_seconds: a fire later than this is a misfire.
    :returns: ``(to_make, skipped)``: the fire times to enqueue with ``True`` for a
        late one (misfire made anyway), oldest first; and how many late fires are
        dropped (counted, for metrics and logs).
    """
    recent: deque[datetime] = deque(maxlen=MISFIRE_ALL_CAP)
    total = 0
    grace = timedelta(seconds=grace_seconds)
    instants: Iterator[datetime] = chain([first], spec.fires(first))
    while True:
        instant = next(instants)
        if instant > now:
            break
        recent.append(instant)
        total += 1
        if total == ENUMERATION_LIMIT:
            period = (instant - first) / (total - 1)
            tail = max(grace, period * MISFIRE_ALL_CAP) * 2
            restart = max(instant, now - tail)
            if restart > instant:
                total += round((restart - instant) / period)  # estimated, not walked
                instants = spec.fires(restart)
    on_time = [f for f in recent if now - f <= grace]
    late = [f for f in recent if now - f > grace]
    late_total = total - len(on_time)
    if policy == "all":
        make = [(f, True) for f in late] + [(f, False) for f in on_time]
        return make, late_total - len(late)
    if policy == "once" and late and not on_time:
        return [(late[-1], True)], late_total - 1
    return [(f, False) for f in on_time], late_total


class Schedules:
    """The schedules of one deployment, over the task facade's stores.

    :param tasks: the task facade (its stores and metrics are used).
    :param declared: this instance's ``[[schedules]]``; it fires only these (by name).
    """

    def __init__(self, tasks: Tasks, declared: Sequence[ScheduleSettings]) -> None:
        self.tasks = tasks
        self.pg = tasks.pg
        self.declared = {s.name: s for s in declared}
        self.broken: dict[str, str] = {}
        """Declared schedules whose row this instance cannot fire (name -> why), skipped until a restart."""
        self.idle_timeout_ms = fire_idle_timeout_ms(s.misfire_grace_seconds for s in declared)
        """The fire transaction's ``idle_in_transaction_session_timeout`` (:func:`fire_idle_timeout_ms`)."""

    def _names(self) -> list[str]:
        return [name for name in self.declared if name not in self.broken]

    # -- the scheduler's side ---------------------------------------------

    async def sync(self, now: datetime) -> list[str]:
        """Mirror the declared schedules into the table.

        :returns: names whose row was created or changed (their next fire recomputed, pause cleared).
        """
        changed: list[str] = []
        next_fires: dict[str, datetime | None] = {}
        async with self.pg.transaction() as tx:
            for s in self.declared.values():
                nxt = s.spec.next_fire(now) if s.enabled else None
                queue = self.tasks.queue_for(s.task, s.queue)
                upserted = await tx.schedules.upsert(
                    s.name,
                    s.cron,
                    s.timezone,
                    s.task,
                    queue,
                    s.priority,
                    dump_json(s.payload, f"schedules[{s.name}].payload"),
                    s.max_retries,
                    s.misfire,
                    s.misfire_grace_seconds,
                    s.overlap,
                    s.enabled,
                    s.config_hash(),
                    nxt,
                    now,
                    s.tenant_id,
                )
                if upserted:
                    changed.append(s.name)
                    next_fires[s.name] = nxt
                else:
                    await tx.schedules.set_queue(s.name, queue)
            await tx.schedules.touch(list(self.declared), now)
            if changed:
                await tx.notify(NOTIFY_CHANNEL, "sync")
        for name in changed:
            log.info("schedule_synced", schedule=name, next_fire_at=_iso(next_fires[name]))
        return changed

    async def next_due(self) -> datetime | None:
        """The earliest ``next_fire_at`` of this instance's active schedules (``None``: nothing to fire)."""
        if not self._names():
            return None
        return await self.pg.schedules.next_due(self._names())

    async def fire_due(self, now: datetime) -> list[Fire]:
        """Fire every due schedule this instance declares (see module docs).

        One connection, one transaction: the due rows are locked, their tasks
        inserted and the rows advanced together, then the tasks are pushed to
        Redis after the commit. Other schedulers are woken (``NOTIFY``) so that
        they re-read the advanced rows instead of retrying the locked ones. The
        transaction is bounded (``FIRE_LOCK_TIMEOUT_MS``, :func:`fire_idle_timeout_ms`):
        an instance cut off while holding rows holds them for less than their grace.
        So that a healthy instance is never that silent in it, the fires are worked
        out before it opens (:func:`plan_fires` takes seconds for a long catch-up)
        from the due rows read without a lock; a row changed in between is worked
        out again inside.

        :param now: the scheduler's clock (PostgreSQL's in production; a manual one in tests).
        :returns: one :class:`Fire` per fire time handled, made or skipped.
        """
        if not self._names():
            return []
        fires: list[Fire] = []
        targets: list[PushTarget] = []
        await self.tasks.learn()  # here, not in the transaction: it reads on another connection
        planned = await self._plan_due(now)
        async with self.pg.transaction(
            lock_timeout_ms=FIRE_LOCK_TIMEOUT_MS, idle_timeout_ms=self.idle_timeout_ms
        ) as tx:
            rows = await tx.schedules.lock_due(self._names(), now)  # rows found broken above are left out
            for row in rows:
                plan = planned.get(row["name"])
                if plan is None or plan.values != tuple(row.values()):
                    plan = await self._plan(row, now)
                if plan is None:
                    continue
                made, pushes = await self._fire_row(tx, row, now, plan)
                fires.extend(made)
                targets.extend(pushes)
            if rows:
                await tx.notify(NOTIFY_CHANNEL, "fired")
        # Logged as soon as committed: a shutdown that cancels the push below (the reconciler
        # pushes those ids later) must not leave a fire made and never reported.
        for f in fires:
            log.info(
                "schedule_fired" if f.task_id else "schedule_fire_skipped",
                schedule=f.schedule,
                fire_at=_iso(f.fire_at),
                outcome=f.outcome,
                task_id=str(f.task_id) if f.task_id else None,
            )
        await self.tasks.push(targets)
        return fires

    async def _plan_due(self, now: datetime) -> dict[str, _Plan]:
        """The due rows' fires by name, worked out from the rows read without a lock."""
        planned: dict[str, _Plan] = {}
        for row in await self.pg.schedules.due(self._names(), now):
            plan = await self._plan(row, now)
            if plan is not None:
                planned[plan.name] = plan
        return planned

    async def _plan(self, row: Any, now: datetime) -> _Plan | None:
        """Work out a due row's fires (``None``: this instance cannot fire the row, now ``broken``)."""
        name = row["name"]
        try:
            spec = _spec(row["cron"], row["timezone"])
            self._spec_for(row, fire_key(name, now))  # a row this version cannot make tasks of fails here, once
        except (CronSpecError, ValidationError, InvalidTaskError, ValueError, TypeError, KeyError) as exc:
            # Written by another version, or by hand: skip it until this instance restarts, so that
            # neither the other schedules nor the scheduler stop for it (and no error every second).
            self.broken[name] = str(exc)
            log.error("schedule_invalid", schedule=name, error=str(exc).splitlines()[0][:500], action="skipped")
            return None
        fires, skipped = await anyio.to_thread.run_sync(
            functools.partial(
                plan_fires,
                spec,
                row["next_fire_at"],
                now,
                policy=row["misfire"],
                grace_seconds=row["misfire_grace_seconds"],
            )
        )
        return _Plan(name, tuple(row.values()), spec, fires, skipped)

    async def _fire_row(
        self, tx: PgStore, row: Any, now: datetime, planned: _Plan
    ) -> tuple[list[Fire], list[PushTarget]]:
        name, spec, plan, skipped = row["name"], planned.spec, planned.fires, planned.skipped
        fires: list[Fire] = []
        targets: list[PushTarget] = []
        if plan and row["overlap"] == "skip":
            running = False
            if row["last_task_id"] is not None:
                status = await tx.tasks.status(row["last_task_id"])
                running = status in (TaskStatus.QUEUED, TaskStatus.RUNNING)
            keep = [] if running else plan[-1:]
            fires.extend(Fire(name, fire_at, "overlap_skipped") for fire_at, _ in plan[: len(plan) - len(keep)])
            plan = keep
        last_task: uuid.UUID | None = None
        if plan:
            made, made_targets = await self.tasks.insert_many(
                tx, [self._spec_for(row, fire_key(name, f)) for f, _ in plan], field_prefix="", task_type=TaskType.CRON
            )
            targets.extend(made_targets)
            for (fire_at, late), result in zip(plan, made, strict=True):
                outcome = "duplicate" if not result.created else ("misfire_fired" if late else "fired")
                fires.append(Fire(name, fire_at, outcome, result.task_id))
                last_task = result.task_id
        last_fire = max((f.fire_at for f in fires if f.task_id is not None), default=None)
        await tx.schedules.advance(name, last_fire, spec.next_fire(now), last_task)
        self._count(name, fires, skipped)
        if skipped:
            log.warning(
                "schedule_misfired",
                schedule=name,
                policy=row["misfire"],
                skipped=skipped,
                made=sum(1 for f in fires if f.outcome == "misfire_fired"),
                since=_iso(row["next_fire_at"]),
                capped=row["misfire"] == "all",
            )
        return fires, targets

    def _spec_for(self, row: Any, key: str) -> TaskSpec:
        fields: dict[str, Any] = {
            "name": row["task"],
            "priority": row["priority"],
            "payload": json_value(row["payload"]),
            "dedup_key": key,
            "max_retries": row["max_retries"],
            "tenant_id": row["tenant_id"],
        }
        if row["queue"]:
            fields["queue_name"] = row["queue"]
        return TaskSpec(**fields)

    def _count(self, name: str, fires: Sequence[Fire], skipped: int) -> None:
        metrics = self.tasks.metrics
        if metrics is None:
            return
        for f in fires:
            metrics.schedule_fires.labels(name, f.outcome).inc()
        if skipped:
            metrics.schedule_fires.labels(name, "misfire_skipped").inc(skipped)

    # -- the operator's side ----------------------------------------------

    async def list(self, reach: Reach = EVERYTHING) -> list[dict[str, Any]]:
        """Every schedule in ``reach``, by name, in the API's shape (``overdue`` by PostgreSQL's clock)."""
        rows = await self.pg.schedules.list()
        now = await self.pg.now()
        return [schedule_to_dict(r, now) for r in rows if reach.sees(r["tenant_id"], r["queue"] or "")]

    async def get(self, name: str, reach: Reach = EVERYTHING) -> dict[str, Any]:
        """One schedule in the API's shape.

        :raises ScheduleNotFoundError: no row has this name, or not one within ``reach``.
        """
        row = await self.pg.schedules.get(name)
        if row is None or not reach.sees(row["tenant_id"], row["queue"] or ""):
            raise ScheduleNotFoundError(name)
        return schedule_to_dict(row, await self.pg.now())

    async def set_paused(
        self, name: str, paused: bool, now: datetime | None = None, reach: Reach = EVERYTHING
    ) -> dict[str, Any]:
        """Pause or resume a schedule; persisted until a config change of that schedule.

        Resuming computes the next fire from ``now`` (default PostgreSQL's clock, the
        scheduler's, not this host's): fires missed while paused are not misfires, they
        are simply not made.

        :raises ScheduleNotFoundError: no row has this name, or not one within ``reach``.
        """
        async with self.pg.transaction() as tx:
            row = await tx.schedules.get_for_update(name)
            if row is None or not reach.sees(row["tenant_id"], row["queue"] or ""):
                raise ScheduleNotFoundError(name)
            now = now or await tx.now()
            if row["paused"] == paused:  # resuming an active schedule must not drop its due fires
                return schedule_to_dict(row, now)
            nxt = None
            if row["enabled"]:
                nxt = _spec(row["cron"], row["timezone"]).next_fire(now)
            updated = await tx.schedules.set_paused(name, paused, nxt)
            assert updated is not None  # the row is locked: nothing deletes it meanwhile
            await tx.notify(NOTIFY_CHANNEL, name)
        log.info("schedule_paused" if paused else "schedule_resumed", schedule=name)
        return schedule_to_dict(updated, now)

    async def trigger(
        self, name: str, idempotency_key: str | None = None, reach: Reach = EVERYTHING
    ) -> tuple[uuid.UUID, str, bool]:
        """Fire a schedule now, outside its spec (also when paused or disabled).

        :param idempotency_key: the caller's key for this trigger, scoped to the schedule:
            the task's key is ``cron:{name}:trigger:{idempotency_key}`` (default a new
            uuid4, so each call makes exactly one task; a repeated key makes none).
        :returns: ``(task_id, idempotency_key, created)``; ``created`` is ``False``
            when the key already named a task.
        :raises ScheduleNotFoundError: no row has this name, or not one within ``reach``.
        """
        row = await self.pg.schedules.get(name)
        if row is None or not reach.sees(row["tenant_id"], row["queue"] or ""):
            raise ScheduleNotFoundError(name)
        key = f"cron:{name}:trigger:{idempotency_key or uuid.uuid4()}"
        audit.note(resource_type="schedule", resource_id=name, tenant_id=row["tenant_id"])
        [result] = await self.tasks.enqueue_many([self._spec_for(row, key)], field_prefix="", task_type=TaskType.CRON)
        if result.created:
            await self.pg.schedules.set_last_task(name, result.task_id)
        self._count(name, [Fire(name, datetime.now(UTC), "triggered" if result.created else "duplicate")], 0)
        log.info("schedule_triggered", schedule=name, task_id=str(result.task_id), created=result.created)
        return result.task_id, key, result.created


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None
