"""Reconciler: Redis is rebuilt from PostgreSQL, the source of truth (docs/internals/design.md principle 1).

Three jobs, each safe to run in every instance at once (``ZADD NX``; the DLQ
mirror is rewritten in one MULTI):

- **Resync after a flush, restart or failover.** Every ``check_interval``
  seconds (1), for each of the instance's queues, it reads the ``run_id`` of
  the Redis node holding the queue's keys and the queue's marker
  ``{prefix}:{q}:marker`` (in the queue's slot, so on a Redis Cluster it lives
  and dies with the queue's keys). A new run_id (a restart, or a failover to
  another node) or a missing marker (a flush, or a restart without
  persistence) triggers that queue's resync at once: every queued task whose
  id Redis lacks is pushed (ready when due, else delayed), and the DLQ mirror
  is rewritten from the failed tasks; then the marker is written. At an
  instance's first look at a queue without a marker (a deployment's first start,
  or clients pushed before any instance marked it) nothing is known to be lost:
  it compares the two counts first and walks only when Redis holds fewer ids
  than PostgreSQL has queued tasks (ids this instance popped and has not
  claimed yet count on Redis's side: see :data:`Popped`; reason ``no marker
  yet``; ``data lost`` is
  for a queue seen before whose marker went). One instance
  resyncs a queue (lock ``{prefix}:lock:resync:{q}``); the others see the
  marker. Only the queues of a flushed or restarted cluster node are resynced.
- **Sweep.** Every ``sweep_interval`` seconds (default 5), per queue, under that
  queue's lock ``{prefix}:lock:reconciler:{q}`` (released when the queue is
  done, so every instance repairs the queues it serves): when PostgreSQL holds
  more queued tasks than Redis holds ids (counted the same way as at a first
  look, Redis first), or once a minute whatever the
  counts say, it walks the queue's queued tasks unchanged for the interval, in
  (run_at, id) order, ``page`` ids at a time, and pushes the missing ones; a
  walk longer than ``max_pages`` pages goes on from its cursor at the next
  sweep, so any backlog is covered, a little each tick. An id missing from
  Redis is pushed only if PostgreSQL still has it queued when asked again and
  no fetcher of this instance holds it in a claim (see :func:`_push`), so a
  walk in the middle of a drain pushes back no ghosts.
- **DLQ mirror repair**, with each queue's sweep.
- **Workflow repair**, with each sweep, in one instance (``{prefix}:lock:workflow_repair``): a
  blocked node whose deps all ended, a workflow over but not marked so, a cancelled one with tasks
  left is decided (``Workflows.repair``). The transaction that ends a task decides all of that
  itself, so each repair is a decision lost to a bug: logged ``workflow_repaired`` and counted
  (``taskmesh_workflow_repairs_total``).

Emits ``redis_resynced`` and ``tasks_repushed`` logs and the
``taskmesh_redis_resyncs_total`` / ``taskmesh_tasks_repushed_total`` metrics.
Tick counts: ``repushed``, ``dlq_repaired``, ``workflows_repaired``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

import anyio

from taskmesh.observability.logs import get_logger
from taskmesh.services.base import Counts, run_periodic
from taskmesh.store.keys import DLQ_MIRROR_MAX
from taskmesh.tasks.models import PushTarget
from taskmesh.tasks.tasks import Tasks
from taskmesh.workflows.workflows import Workflows

log = get_logger("taskmesh.reconciler")

PAGE = 1000
MAX_PAGES = 50
"""Pages one queue's sweep walks per tick (50,000 ids); a longer walk resumes next tick."""
FULL_SWEEP_EVERY = 60.0
"""Seconds between sweeps that walk every queue, drift or not (counts can hide a swap)."""
LOCK_MS = 30_000
FIRST_LOOKS = 3
"""Count comparisons at an instance's first look at an unmarked queue before it walks the queue."""

Popped = Callable[[str], Collection[str]]
"""The ids of a queue this instance's fetchers have popped and whose claim has not
answered yet (``QueueWorkers.popped``). Such ids are in neither Redis nor, as claimed,
PostgreSQL: without them every count taken during a drain looks like ids went missing,
and a walk pushes the ids in a claim back as ghosts."""


def none_popped(queue: str) -> Collection[str]:
    """The :data:`Popped` of an instance without workers (and of tests): none."""
    return ()


@dataclass
class Cursor:
    """Where a queue's walk stopped: the last (run_at, id) seen; ``None`` at the start."""

    run_at: datetime | None = None
    task_id: uuid.UUID | None = None

    @property
    def at_start(self) -> bool:
        return self.task_id is None


@dataclass
class State:
    """What the reconciler remembers between ticks."""

    run_ids: dict[str, str] = field(default_factory=dict)
    """Per queue, the run_id of the node holding its keys once its marker was seen there."""
    cursors: dict[str, Cursor] = field(default_factory=dict)
    next_full: float = 0.0


async def _push(tasks: Tasks, targets: Sequence[PushTarget], popped: Popped) -> int:
    """Push the targets that are missing from Redis and still queued; returns how many.

    An id a walk read as queued can be popped before Redis is asked: absent from Redis,
    it is a ghost, not a lost id, while its claim runs. So the absent ids are looked up
    again in PostgreSQL, skipping the ones this instance's fetchers hold in a claim at
    that moment: a claim answered before the look-up had committed, so the look-up sees
    its task running, and one still in flight is in ``popped``. A claim in flight during
    the look-up that ``popped`` does not show (another instance's, or one whose pop's
    answer is still on its way here) can still let a ghost through, about a millisecond
    of each walk's page; that claim's refusal then drops the ghost.
    """
    absent = await tasks.redis.absent(targets)
    if not absent:
        return 0
    held: set[str] = set()
    for queue in {t.queue for t in absent}:
        held.update(popped(queue))  # before the look-up starts: see above
    candidates = [t for t in absent if str(t.task_id) not in held]
    if not candidates:
        return 0
    queued = {r["id"] for r in await tasks.pg.tasks.list_unclaimed_queued([t.task_id for t in candidates])}
    pushed = [t for t in candidates if t.task_id in queued]
    await tasks.redis.push_ready_or_delayed(pushed)
    if tasks.metrics is not None:
        for queue, n in Counter(t.queue for t in pushed).items():
            tasks.metrics.tasks_repushed_to(queue, n)
    return len(pushed)


async def walk(
    tasks: Tasks, queue: str, cursor: Cursor, *, min_age: float, max_pages: int | None, popped: Popped = none_popped
) -> int:
    """Push the missing ids of ``queue`` from ``cursor`` on; returns ids pushed.

    ``cursor`` moves as pages are read and goes back to the start when the walk
    reaches the end (``max_pages=None``: walk to the end now).
    """
    pushed = 0
    pages = 0
    while max_pages is None or pages < max_pages:
        rows = await tasks.pg.tasks.list_queued_after(queue, cursor.run_at, cursor.task_id, min_age, PAGE)
        pages += 1
        if rows:
            targets = [PushTarget(r["id"], r["queue"], r["priority"], r["run_at"], r["limit_keys"]) for r in rows]
            pushed += await _push(tasks, targets, popped)
            cursor.run_at, cursor.task_id = rows[-1]["run_at"], rows[-1]["id"]
        if len(rows) < PAGE:
            cursor.run_at = cursor.task_id = None
            break
    return pushed


async def repair_dlq(tasks: Tasks, queue: str) -> bool:
    """Rewrite the queue's DLQ mirror when it differs from PostgreSQL; returns whether it did."""
    failed = await tasks.pg.tasks.list_failed_ids(queue, DLQ_MIRROR_MAX)
    return await tasks.redis.rewrite_dlq(queue, [(str(i), at) for i, at in failed])


async def drifted(tasks: Tasks, queue: str, popped: Popped) -> bool:
    """Whether Redis holds fewer ids of ``queue`` (ready, delayed, or parked by a limit) than PostgreSQL has
    queued tasks.

    Redis is counted first, and this instance's popped ids with it: an id popped and
    claimed between the two counts then counts on neither side or on Redis's, and an
    id popped here and not claimed yet counts on both. Another instance's popped ids,
    or a task committed between the counts and not pushed yet, can still make the
    counts differ (a walk that finds nothing). An id popped here just after Redis's
    count counts twice and can hide as many lost ids for one look; the next sweep, or
    the full walk once a minute, finds them.
    """
    ready, delayed, _ = await tasks.redis.depths(queue)
    parked = await tasks.redis.limits.parked_count(queue)
    held = len(popped(queue))
    queued = (await tasks.pg.tasks.count_queued([queue])).get(queue, 0)
    return ready + delayed + parked + held < queued


async def sweep(
    tasks: Tasks,
    queues: Sequence[str],
    state: State,
    *,
    min_age: float,
    full: bool,
    popped: Popped = none_popped,
) -> Counts:
    """One sweep of every queue whose lock this instance gets (see module docs)."""
    pushed = repaired = 0
    for queue in queues:
        key = tasks.redis.keys.lock("reconciler", queue)
        token = await tasks.redis.limits.try_lock(key, LOCK_MS)
        if token is None:
            continue
        try:
            cursor = state.cursors.setdefault(queue, Cursor())
            if full or not cursor.at_start or await drifted(tasks, queue, popped):
                pushed += await walk(tasks, queue, cursor, min_age=min_age, max_pages=MAX_PAGES, popped=popped)
            repaired += await repair_dlq(tasks, queue)
        finally:
            await tasks.redis.limits.release_lock(key, token)
    if pushed:
        log.info("tasks_repushed", count=pushed)
    return {"repushed": pushed, "dlq_repaired": repaired, "workflows_repaired": await repair_workflows(tasks)}


async def repair_workflows(tasks: Tasks) -> int:
    """Decide the workflow nodes no transaction decided (one instance per sweep: ``{prefix}:lock:workflow_repair``).

    :returns: nodes decided (each a repair, logged ``workflow_repaired`` and counted).
    """
    key = tasks.redis.keys.lock("workflow_repair")
    token = await tasks.redis.limits.try_lock(key, LOCK_MS)
    if token is None:
        return 0
    try:
        repaired = await Workflows(tasks).repair()
    finally:
        await tasks.redis.limits.release_lock(key, token)
    if repaired and tasks.metrics:
        tasks.metrics.workflow_repairs.inc(repaired)
    return repaired


async def resync(tasks: Tasks, queues: Sequence[str], popped: Popped = none_popped) -> int:
    """Give running tasks their limit slots again, push every queued task Redis lacks and rewrite the DLQ
    mirrors; returns ids pushed.

    The slots come first: a limited id pushed before them could start beside runs Redis had forgotten.
    Until the marker is written again, the admission starts no limited id (``lua/limits_admit.lua``).
    """
    pushed = 0
    for queue in queues:
        running = await tasks.pg.tasks.list_running_limited(queue)
        await tasks.redis.limits.restore(queue, [(r["id"], r["limit_keys"], r["until_ms"]) for r in running])
        pushed += await walk(tasks, queue, Cursor(), min_age=0, max_pages=None, popped=popped)
        await repair_dlq(tasks, queue)
    return pushed


async def _nothing_missing(tasks: Tasks, queue: str, popped: Popped) -> bool:
    """Whether Redis holds as many ids of ``queue`` as PostgreSQL has queued tasks, at one of
    :data:`FIRST_LOOKS` looks a moment apart (each look as :func:`drifted` counts).

    Another instance's popped ids can make one look differ, hence a few looks. Counts can
    hide a swap; the sweep's full walk, once a minute, does not.
    """
    for look in range(FIRST_LOOKS):
        if look:
            await anyio.sleep(0.01)
        if not await drifted(tasks, queue, popped):
            return True
    return False


async def check(
    tasks: Tasks, queues: Sequence[str], state: State, *, instance: str, popped: Popped = none_popped
) -> int | None:
    """Detect queues whose keys Redis lost (flush, restart, failover) and resync them.

    :returns: ids pushed, or ``None`` when no queue was resynced.
    """
    seen = await tasks.redis.identity(queues)
    stale: list[str] = []
    for queue, (run_id, marker) in seen.items():
        if marker and queue not in state.run_ids:
            state.run_ids[queue] = run_id  # first look at a healthy queue: nothing was lost
        elif not marker or state.run_ids[queue] != run_id:
            stale.append(queue)
    pushed = 0
    reasons: dict[str, str] = {}
    for queue in stale:
        done = await _resync_queue(tasks, queue, state, instance=instance, popped=popped)
        if done is not None:
            reasons[queue] = done[0]
            pushed += done[1]
    if not reasons:
        return None
    if tasks.metrics is not None:
        tasks.metrics.redis_resyncs.inc()
    # No marker: Redis lost the queue's keys, or this is the deployment's first start (nothing pushed).
    reason = ", ".join(sorted(set(reasons.values())))
    (log.warning if pushed else log.info)("redis_resynced", pushed=pushed, reason=reason, queues=sorted(reasons))
    return pushed


async def _resync_queue(
    tasks: Tasks, queue: str, state: State, *, instance: str, popped: Popped
) -> tuple[str, int] | None:
    """Resync one queue under its lock; ``(reason, pushed)``, or ``None`` when it was not needed here."""
    lock = tasks.redis.keys.lock("resync", queue)
    token = await tasks.redis.limits.try_lock(lock, 60_000)
    if token is None:
        return None  # another instance resyncs it; the marker tells us when it is done
    try:
        # Someone may have finished a resync between our look and our lock.
        run_id, marker = (await tasks.redis.identity([queue]))[queue]
        known = state.run_ids.get(queue)
        if marker and known in (None, run_id):
            state.run_ids[queue] = run_id
            return None
        # A queue never seen here and without a marker: the deployment's first start, or clients
        # pushed to a Redis no instance had marked yet. Walk it only when ids are missing.
        first_look = known is None and not marker
        pushed = (
            0 if first_look and await _nothing_missing(tasks, queue, popped) else await resync(tasks, [queue], popped)
        )
        await tasks.redis.set_marker(queue, instance)
        state.run_ids[queue] = run_id
        # Only a queue seen before whose marker is gone is known to have lost its keys.
        return ("restart" if marker else "data lost" if known is not None else "no marker yet"), pushed
    finally:
        await tasks.redis.limits.release_lock(lock, token)


async def run_once(
    tasks: Tasks,
    queues: Sequence[str],
    state: State,
    *,
    instance: str,
    sweep_interval: float,
    popped: Popped = none_popped,
) -> Counts:
    """One check, and a sweep when one is due (what :func:`run`'s two loops do, in one call, for tests)."""
    await check(tasks, queues, state, instance=instance, popped=popped)
    return await sweep_if_due(tasks, queues, state, sweep_interval=sweep_interval, popped=popped)


async def sweep_if_due(
    tasks: Tasks, queues: Sequence[str], state: State, *, sweep_interval: float, popped: Popped = none_popped
) -> Counts:
    """A sweep, full once a minute."""
    now = anyio.current_time()
    full = now >= state.next_full
    if full:
        state.next_full = now + FULL_SWEEP_EVERY
    return await sweep(tasks, queues, state, min_age=sweep_interval, full=full, popped=popped)


async def run(
    tasks: Tasks,
    queues: Sequence[str],
    *,
    instance: str,
    sweep_interval: float = 5.0,
    check_interval: float = 1.0,
    popped: Popped = none_popped,
) -> None:
    """Watch and sweep for ever (cancelled by the supervisor).

    Two loops, each with its own view of an outage: the check reads Redis every
    second, the sweep reads PostgreSQL every ``sweep_interval``; one outage is
    logged once by the loop that meets it.

    :param popped: this instance's popped and unclaimed ids of a queue (see :data:`Popped`).
    """
    state = State(next_full=anyio.current_time() + FULL_SWEEP_EVERY)

    async def watch() -> Counts:
        await check(tasks, queues, state, instance=instance, popped=popped)
        return {}

    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(run_periodic, "reconciler", watch, interval=check_interval))
        tg.start_soon(
            partial(
                run_periodic,
                "reconciler_sweep",
                lambda: sweep_if_due(tasks, queues, state, sweep_interval=sweep_interval, popped=popped),
                interval=sweep_interval,
                first_delay=sweep_interval,
            )
        )
