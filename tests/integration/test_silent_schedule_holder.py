"""A scheduler gone silent while it holds a due schedule row costs no slot.

The fire transaction locks the due rows ``FOR UPDATE SKIP LOCKED``; an instance cut off
from PostgreSQL (or frozen) inside it used to keep them locked with no bound, and every
other scheduler skipped them as locked. Then the transaction set a fixed
``idle_in_transaction_session_timeout`` of 5 s: longer than a 4 s misfire grace, so the
slot the holder took was a misfire by the time another instance could fire it, and was
lost. Now the timeout is a quarter of the shortest grace (1 to 5 s, ``fire_idle_timeout_ms``):
PostgreSQL ends the silent holder's session, the row is free again, and another instance
fires the slot within its grace.

Two :class:`Schedules` on one database, each with its own pool, as two instances have
them. Scheduler A locks the due row and goes silent inside its fire transaction (its
``_fire_row`` waits on an event, so its connection sits idle in transaction, as a
frozen or cut-off instance's does); scheduler B runs the real scheduler loop on the
real clock over three five-second slots (about 17 s).

The other side of that bound: a healthy instance is never silent that long in its fire
transaction, because the fires are worked out before it opens.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.config import ScheduleSettings
from taskmesh.errors import StoreError
from taskmesh.observability.metrics import Metrics
from taskmesh.runtime.clock import SystemClock, Waker
from taskmesh.schedules import schedules as schedules_module
from taskmesh.schedules.schedules import Fire, Schedules
from taskmesh.services import scheduler
from taskmesh.store import PgStore, Stores
from taskmesh.tasks.models import PushTarget
from taskmesh.tasks.tasks import Tasks

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SLOT_SECONDS = 5
GRACE_SECONDS = 4.0
"""The schedule's misfire grace: shorter than a slot, as in the partition that lost one."""
SLOTS_AFTER = 2
"""Slots B is watched over after the one A holds."""


class SilentHolder(Schedules):
    """A scheduler that locks the due rows and then says nothing to PostgreSQL until ``release`` is set."""

    def __init__(self, tasks: Tasks, declared: list[ScheduleSettings]) -> None:
        super().__init__(tasks, declared)
        self.holding = anyio.Event()
        self.release = anyio.Event()

    async def _fire_row(self, tx: Any, row: Any, now: datetime, plan: Any) -> tuple[list[Fire], list[PushTarget]]:
        self.holding.set()  # the row is locked: lock_due returned it inside the open transaction
        await self.release.wait()
        return await super()._fire_row(tx, row, now, plan)


@pytest.fixture
async def two_pools(pool: asyncpg.Pool, database_url: str) -> AsyncIterator[tuple[asyncpg.Pool, asyncpg.Pool]]:
    """One pool per scheduler (as two instances have); the schedules table starts empty."""
    await pool.execute("TRUNCATE schedules")
    a = await asyncpg.create_pool(database_url, min_size=1, max_size=3)
    b = await asyncpg.create_pool(database_url, min_size=1, max_size=3)
    assert a is not None and b is not None
    try:
        yield a, b
    finally:
        with anyio.move_on_after(5):
            await a.close()
            await b.close()


def _fire_at(key: str) -> datetime:
    return datetime.fromisoformat(key.removeprefix("cron:five:").replace("Z", "+00:00"))


async def test_a_slot_a_silent_scheduler_holds_is_fired_by_another_within_its_grace(
    two_pools: tuple[asyncpg.Pool, asyncpg.Pool], stores: Stores, pool: asyncpg.Pool
) -> None:
    declared = [
        ScheduleSettings(
            name="five",
            cron=f"*/{SLOT_SECONDS} * * * * *",
            task="report.build",
            misfire_grace_seconds=GRACE_SECONDS,
        )
    ]
    pool_a, pool_b = two_pools
    a = SilentHolder(Tasks(PgStore(pool_a), stores.redis, metrics=Metrics()), declared)
    b = Schedules(Tasks(PgStore(pool_b), stores.redis, metrics=Metrics()), declared)

    # Start just after a slot boundary, so that B's first wake-up is almost a slot away.
    now = datetime.now(UTC)
    boundary = now.replace(second=now.second - now.second % SLOT_SECONDS, microsecond=0)
    await anyio.sleep((boundary + timedelta(seconds=SLOT_SECONDS, milliseconds=300) - now).total_seconds())
    held_slot = boundary + timedelta(seconds=SLOT_SECONDS)
    last_slot = held_slot + timedelta(seconds=SLOT_SECONDS * SLOTS_AFTER)
    a_outcome: list[list[Fire] | StoreError] = []

    async def silent_a() -> None:
        try:
            a_outcome.append(await a.fire_due(datetime.now(UTC)))
        except StoreError as exc:
            a_outcome.append(exc)

    async with anyio.create_task_group() as holder:
        async with anyio.create_task_group() as tg:
            wake_b = Waker()
            tg.start_soon(functools.partial(scheduler.run, b, SystemClock(), wake_b))
            with anyio.fail_after(5):
                while await b.next_due() is None:  # B synced the row and sleeps until the next slot
                    await anyio.sleep(0.02)
            first_wake = await b.next_due()
            # The slot that just began is due, and A takes it (the row's next fire, as a scheduler
            # that looked a moment ago would have left it); then A goes silent holding the row.
            await pool.execute("UPDATE schedules SET next_fire_at = $1 WHERE name = 'five'", held_slot)
            holder.start_soon(silent_a)
            with anyio.fail_after(5):
                await a.holding.wait()
            # B looks at once, as a scheduler that woke for the slot with A would have: it finds the
            # row locked and looks again every second until the holder's session ends.
            wake_b.wake()
            # B runs on the real clock until the last slot of the window has had its chance.
            await anyio.sleep((last_slot + timedelta(milliseconds=1500) - datetime.now(UTC)).total_seconds())
            tg.cancel_scope.cancel()
        rows = await pool.fetch(
            "SELECT idempotency_key, created_at FROM tasks WHERE idempotency_key LIKE 'cron:five:%'"
        )
        a.release.set()  # A, let go at last, carries on with its fire
        with anyio.fail_after(10):
            while not a_outcome:
                await anyio.sleep(0.02)

    assert first_wake == held_slot + timedelta(seconds=SLOT_SECONDS)
    made = {_fire_at(r["idempotency_key"]): r["created_at"] for r in rows}
    slots = [held_slot + timedelta(seconds=SLOT_SECONDS * i) for i in range(SLOTS_AFTER + 1)]
    # Every slot made, the held one too: the holder's session ends a quarter of the grace after it
    # went silent and B takes the row over within a second, inside the grace. With a timeout
    # longer than the grace, the held slot was a misfire by then and dropped (misfire "once").
    assert sorted(s for s in made if held_slot <= s <= last_slot) == slots, (slots, sorted(made))
    assert (made[held_slot] - held_slot).total_seconds() <= GRACE_SECONDS, made[held_slot]
    # The slots after it are on time (each task made within 1.5 s).
    for slot in slots[1:]:
        assert 0 <= (made[slot] - slot).total_seconds() < 1.5, (slot, made[slot])
    # A finds its session ended by PostgreSQL: its late fire is refused, not made a second time.
    [outcome] = a_outcome
    assert isinstance(outcome, StoreError) and outcome.transient, outcome
    after: int = await pool.fetchval("SELECT count(*) FROM tasks WHERE idempotency_key LIKE 'cron:five:%'")
    assert after == len(rows)


async def test_a_fire_whose_plan_outlasts_the_idle_timeout_still_fires(
    stores: Stores, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side of the bound: a healthy instance is never silent that long mid-fire.

    Working out a long catch-up (a per-second spec with a day's grace, down for days) takes
    seconds of CPU; done inside the fire transaction, PostgreSQL ended the session of the
    healthy instance as a silent one's, every time it tried, so the schedule never fired
    again. Here the plan is slowed to twice the 1 s timeout a 4 s grace sets.
    """
    await pool.execute("TRUNCATE schedules")
    declared = [
        ScheduleSettings(name="tick", cron="*/5 * * * * *", task="report.build", misfire_grace_seconds=GRACE_SECONDS),
        ScheduleSettings(name="behind", cron="* * * * * *", task="report.build", misfire_grace_seconds=86400.0),
    ]
    schedules = Schedules(Tasks(stores.pg, stores.redis, metrics=Metrics()), declared)
    now = datetime.now(UTC).replace(microsecond=0)
    await schedules.sync(now)
    await pool.execute("UPDATE schedules SET next_fire_at = $1 WHERE name = 'behind'", now - timedelta(seconds=30))
    real_plan = schedules_module.plan_fires

    def slow_plan(*args: Any, **kwargs: Any) -> tuple[list[tuple[datetime, bool]], int]:
        time.sleep(2 * schedules.idle_timeout_ms / 1000)  # in the worker thread, as the CPU-bound walk is
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(schedules_module, "plan_fires", slow_plan)
    with anyio.fail_after(20):
        fires = await schedules.fire_due(now)
    assert {(f.schedule, f.outcome) for f in fires} == {("behind", "fired")}
    assert len(fires) == 31
    row = await pool.fetchrow("SELECT next_fire_at FROM schedules WHERE name = 'behind'")
    assert row is not None and row["next_fire_at"] == now + timedelta(seconds=1)


async def test_a_row_changed_after_it_was_planned_is_fired_as_locked(stores: Stores, pool: asyncpg.Pool) -> None:
    """The fires worked out before the transaction are used only for a row that has not moved since."""
    await pool.execute("TRUNCATE schedules")
    declared = [ScheduleSettings(name="behind", cron="* * * * * *", task="report.build", misfire_grace_seconds=3600.0)]
    now = datetime.now(UTC).replace(microsecond=0)

    class MovedAfterPlanning(Schedules):
        async def _plan_due(self, now: datetime) -> Any:
            planned = await super()._plan_due(now)
            # An operator's or another version's write lands between the read and the lock.
            await pool.execute("UPDATE schedules SET next_fire_at = $1", now - timedelta(seconds=20))
            return planned

    schedules = MovedAfterPlanning(Tasks(stores.pg, stores.redis, metrics=Metrics()), declared)
    await schedules.sync(now)
    await pool.execute("UPDATE schedules SET next_fire_at = $1", now - timedelta(seconds=10))
    fires = await schedules.fire_due(now)
    assert [f.fire_at for f in fires] == [now - timedelta(seconds=20 - i) for i in range(21)]
