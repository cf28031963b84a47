"""Cron schedules against real PostgreSQL and Redis, time driven by a manual clock."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.config import ScheduleSettings
from taskmesh.errors import ConfigError, ScheduleNotFoundError
from taskmesh.observability.metrics import Metrics
from taskmesh.runtime import supervisor
from taskmesh.runtime.clock import ManualClock, Waker
from taskmesh.schedules.schedules import Schedules
from taskmesh.services import scheduler
from taskmesh.store import PgStore, Stores
from taskmesh.tasks.advertised import AdvertisedHandlers
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.tasks import Tasks
from tests.conftest import POOLER, http, wait_for
from tests.one_connection import OneConnectionPool, one_connection_pool

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 6, 1, 12, 0, 0, 500000, tzinfo=UTC)  # half a second past the minute


def sched(name: str = "every-minute", cron: str = "* * * * *", **extra: Any) -> ScheduleSettings:
    return ScheduleSettings(name=name, cron=cron, task="report.build", **extra)


@pytest.fixture
async def clean(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute("TRUNCATE schedules")
    return pool


@pytest.fixture
def report_handler(registry: Registry) -> None:
    """Registers the ``report.build`` handler the instance-level tests' schedules name."""

    @registry.task("report.build")
    async def build(payload: Any) -> None:
        return None


@pytest.fixture
async def one(clean: asyncpg.Pool, database_url: str) -> AsyncIterator[OneConnectionPool]:
    """The schedules' pool: one connection, so that a fire taking a second one fails the test."""
    async with one_connection_pool(database_url, POOLER) as p:
        yield p


@pytest.fixture
def make(one: OneConnectionPool, stores: Stores) -> Callable[..., Schedules]:
    def build(*declared: ScheduleSettings, pool: asyncpg.Pool | None = None) -> Schedules:
        tasks = Tasks(PgStore(pool or one), stores.redis, metrics=Metrics())
        return Schedules(tasks, declared)

    return build


async def cron_keys(pool: asyncpg.Pool, name: str | None = None) -> list[str]:
    rows = await pool.fetch(
        "SELECT idempotency_key FROM tasks WHERE type = 'cron' AND ($1::text IS NULL OR idempotency_key LIKE $1)"
        " ORDER BY idempotency_key",
        f"cron:{name}:%" if name else None,
    )
    return [r["idempotency_key"] for r in rows]


def fires_of(s: Schedules, name: str, outcome: str) -> float:
    assert s.tasks.metrics is not None
    value = s.tasks.metrics.registry.get_sample_value(
        "taskmesh_schedule_fires_total", {"schedule": name, "outcome": outcome}
    )
    return value or 0.0


async def test_every_minute_over_a_simulated_hour_fires_sixty_tasks(make: Callable[..., Schedules]) -> None:
    s = make(sched())
    clock = ManualClock(T0)
    waker = Waker()
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(scheduler.run, s, clock, waker))
        await wait_for(lambda: s.next_due())
        for minute in range(1, 61):
            clock.set(T0.replace(microsecond=0) + timedelta(minutes=minute, milliseconds=200))
            await wait_for(functools.partial(_count_is, s, minute))
        tg.cancel_scope.cancel()
    keys = await cron_keys(s.pg.pool)
    assert len(keys) == 60 == len(set(keys))
    assert keys[0] == "cron:every-minute:2026-06-01T12:01:00Z"
    assert keys[-1] == "cron:every-minute:2026-06-01T13:00:00Z"
    assert fires_of(s, "every-minute", "fired") == 60
    assert fires_of(s, "every-minute", "misfire_skipped") == 0
    row = await s.pg.pool.fetchrow("SELECT type, status, name, queue FROM tasks LIMIT 1")
    assert row is not None
    assert dict(row) == {"type": "cron", "status": "queued", "name": "report.build", "queue": "default"}


async def _count_is(s: Schedules, n: int) -> bool:
    count: int = await s.pg.pool.fetchval("SELECT count(*) FROM tasks")
    return count == n


async def test_the_scheduler_sleeps_until_the_next_fire_and_not_before(make: Callable[..., Schedules]) -> None:
    s = make(sched(cron="0 2 * * *", timezone="Asia/Shanghai"))
    clock = ManualClock(T0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(scheduler.run, s, clock, Waker()))
        due = await wait_for(lambda: s.next_due())
        assert due == datetime(2026, 6, 1, 18, 0, tzinfo=UTC)  # 02:00 in Shanghai
        clock.set(due - timedelta(seconds=1))
        await anyio.sleep(0.2)
        assert await cron_keys(s.pg.pool) == []
        clock.set(due)
        await wait_for(lambda: _count_is(s, 1))
        tg.cancel_scope.cancel()
    assert await cron_keys(s.pg.pool) == ["cron:every-minute:2026-06-01T18:00:00Z"]


@pytest.mark.parametrize("instances", [2, 5])
async def test_several_schedulers_on_one_database_fire_each_time_once(
    make: Callable[..., Schedules], database_url: str, instances: int
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        pools = [await stack.enter_async_context(one_connection_pool(database_url, POOLER)) for _ in range(instances)]
        many = [make(sched(), sched("hourly", "0 * * * *"), pool=p) for p in pools]
        for s in many:
            await s.sync(T0)
        for minute in range(1, 31):
            now = T0.replace(microsecond=0) + timedelta(minutes=minute)
            async with anyio.create_task_group() as tg:
                for s in many:
                    tg.start_soon(s.fire_due, now)
        keys = await cron_keys(many[0].pg.pool)
        assert len(keys) == 30 == len(set(keys))
        assert sum(fires_of(s, "every-minute", "fired") for s in many) == 30
        assert sum(fires_of(s, "every-minute", "duplicate") for s in many) == 0


async def test_an_instance_dying_between_the_task_and_the_row_makes_no_second_task(
    make: Callable[..., Schedules],
) -> None:
    s = make(sched())
    await s.sync(T0)
    now = T0.replace(microsecond=0) + timedelta(minutes=1)
    await s.fire_due(now)
    # As if the row's update had been lost: the next instance sees the same fire due.
    await s.pg.pool.execute("UPDATE schedules SET next_fire_at = $1", now)
    other = make(sched())
    fires = await other.fire_due(now)
    assert [f.outcome for f in fires] == ["duplicate"]
    assert await cron_keys(s.pg.pool) == ["cron:every-minute:2026-06-01T12:01:00Z"]


@pytest.mark.parametrize(("policy", "expected"), [("skip", 0), ("once", 1), ("all", 180)])
async def test_misfire_policies_after_a_three_hour_outage(
    make: Callable[..., Schedules], policy: str, expected: int
) -> None:
    s = make(sched(misfire=policy, misfire_grace_seconds=10))
    await s.sync(T0)  # next fire 12:01
    back = T0.replace(microsecond=0) + timedelta(hours=3, seconds=59)  # 15:00:59, the last due fire 59 s late
    await s.fire_due(back)
    keys = await cron_keys(s.pg.pool)
    assert len(keys) == expected
    if policy == "once":
        assert keys == ["cron:every-minute:2026-06-01T15:00:00Z"]
    assert fires_of(s, "every-minute", "misfire_fired") == expected
    assert fires_of(s, "every-minute", "misfire_skipped") == 180 - expected
    row = await s.pg.pool.fetchrow("SELECT next_fire_at FROM schedules")
    assert row is not None
    assert row["next_fire_at"] == datetime(2026, 6, 1, 15, 1, tzinfo=UTC)


async def test_a_restart_after_downtime_applies_the_policy_and_keeps_the_rhythm(
    make: Callable[..., Schedules],
) -> None:
    s = make(sched(misfire="once", misfire_grace_seconds=10))
    await s.sync(T0)
    await s.fire_due(T0.replace(microsecond=0) + timedelta(minutes=1))
    # The instance stops; a new one (same config) starts 10 minutes later.
    later = T0.replace(microsecond=0) + timedelta(minutes=11, seconds=30)
    again = make(sched(misfire="once", misfire_grace_seconds=10))
    assert await again.sync(later) == []  # unchanged declaration: row kept, misfires to handle
    await again.fire_due(later)
    assert await cron_keys(s.pg.pool) == [
        "cron:every-minute:2026-06-01T12:01:00Z",
        "cron:every-minute:2026-06-01T12:11:00Z",
    ]


async def test_pause_survives_a_restart_until_the_config_changes(make: Callable[..., Schedules]) -> None:
    s = make(sched())
    await s.sync(T0)
    view = await s.set_paused("every-minute", True, T0)
    assert view["paused"] is True and view["next_fires"] == []
    restarted = make(sched())
    await restarted.sync(T0 + timedelta(minutes=5))
    assert await restarted.fire_due(T0 + timedelta(minutes=6)) == []
    assert (await restarted.get("every-minute"))["paused"] is True
    changed = make(sched(cron="*/2 * * * *"))
    assert await changed.sync(T0 + timedelta(minutes=7)) == ["every-minute"]
    assert (await changed.get("every-minute"))["paused"] is False
    await changed.fire_due(T0.replace(microsecond=0) + timedelta(minutes=8))
    assert await cron_keys(s.pg.pool) == ["cron:every-minute:2026-06-01T12:08:00Z"]


async def test_resume_does_not_make_the_fires_missed_while_paused(make: Callable[..., Schedules]) -> None:
    s = make(sched(misfire="all"))
    await s.sync(T0)
    await s.set_paused("every-minute", True, T0)
    resumed = await s.set_paused("every-minute", False, T0 + timedelta(minutes=30))
    assert resumed["next_fires"][0]["utc"] == "2026-06-01T12:31:00Z"
    await s.fire_due(T0.replace(microsecond=0) + timedelta(minutes=31))
    assert await cron_keys(s.pg.pool) == ["cron:every-minute:2026-06-01T12:31:00Z"]


async def test_trigger_makes_exactly_one_task_per_call(make: Callable[..., Schedules]) -> None:
    s = make(sched())
    await s.sync(T0)
    first, key1, created1 = await s.trigger("every-minute")
    second, key2, created2 = await s.trigger("every-minute")
    assert created1 and created2 and first != second and key1 != key2
    assert key1.startswith("cron:every-minute:trigger:")
    again, key3, created3 = await s.trigger("every-minute", "deploy-1234")
    same, _, created4 = await s.trigger("every-minute", "deploy-1234")
    assert (created3, created4, again == same) == (True, False, True)
    assert key3 == "cron:every-minute:trigger:deploy-1234"  # scoped: another schedule's key cannot collide
    assert await s.pg.pool.fetchval("SELECT count(*) FROM tasks WHERE type = 'cron'") == 3
    assert fires_of(s, "every-minute", "triggered") == 3
    with pytest.raises(ScheduleNotFoundError, match="schedule 'nope' not found"):
        await s.trigger("nope")


async def test_overlap_skip_makes_no_task_while_the_previous_one_is_unfinished(
    make: Callable[..., Schedules],
) -> None:
    s = make(sched(overlap="skip"))
    await s.sync(T0)
    base = T0.replace(microsecond=0)
    await s.fire_due(base + timedelta(minutes=1))
    await s.fire_due(base + timedelta(minutes=2))  # the 12:01 task is still queued
    assert await cron_keys(s.pg.pool) == ["cron:every-minute:2026-06-01T12:01:00Z"]
    assert fires_of(s, "every-minute", "overlap_skipped") == 1
    await s.pg.pool.execute("UPDATE tasks SET status = 'running'")
    await s.fire_due(base + timedelta(minutes=3))
    assert fires_of(s, "every-minute", "overlap_skipped") == 2
    await s.pg.pool.execute("UPDATE tasks SET status = 'completed'")
    await s.fire_due(base + timedelta(minutes=4))
    assert await cron_keys(s.pg.pool) == [
        "cron:every-minute:2026-06-01T12:01:00Z",
        "cron:every-minute:2026-06-01T12:04:00Z",
    ]


async def test_dst_nights_fire_at_the_exact_instants(make: Callable[..., Schedules]) -> None:
    ny = sched("ny-0130", "30 1 * * *", timezone="America/New_York")
    berlin = sched("berlin-0230", "30 2 * * *", timezone="Europe/Berlin")
    hourly = sched("ny-hourly", "0 * * * *", timezone="America/New_York")
    s = make(ny, berlin, hourly)
    start = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)
    await s.sync(start)
    clock = ManualClock(start)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(scheduler.run, s, clock, Waker()))
        await wait_for(lambda: s.next_due())
        # Walk the clock in 10-minute steps over both fall-back nights (Berlin 10-25, New York 11-01).
        while clock.now() < datetime(2026, 11, 1, 9, 0, tzinfo=UTC):
            clock.advance(600)
            await wait_for(lambda: _caught_up(s, clock.now()))
        tg.cancel_scope.cancel()
    berlin_days = ["2026-10-25T00:30:00Z"] + [f"2026-10-{n}T01:30:00Z" for n in range(26, 32)]
    assert await cron_keys(s.pg.pool, "berlin-0230") == [
        f"cron:berlin-0230:{d}" for d in [*berlin_days, "2026-11-01T01:30:00Z"]
    ]
    ny_keys = await cron_keys(s.pg.pool, "ny-0130")
    assert ny_keys[-2:] == ["cron:ny-0130:2026-10-31T05:30:00Z", "cron:ny-0130:2026-11-01T05:30:00Z"]
    hourly_keys = await cron_keys(s.pg.pool, "ny-hourly")
    assert hourly_keys[-4:] == [
        "cron:ny-hourly:2026-11-01T06:00:00Z",  # 01:00 EST, the repeated hour
        "cron:ny-hourly:2026-11-01T07:00:00Z",
        "cron:ny-hourly:2026-11-01T08:00:00Z",
        "cron:ny-hourly:2026-11-01T09:00:00Z",
    ]
    assert "cron:ny-hourly:2026-11-01T05:00:00Z" in hourly_keys
    assert len(hourly_keys) == len(set(hourly_keys)) == 24 * 7 + 11


async def _caught_up(s: Schedules, now: datetime) -> bool:
    due = await s.next_due()
    return due is not None and due > now


async def test_the_api_lists_triggers_pauses_and_resumes(
    start_instance: Callable[..., Any], report_handler: None, clean: asyncpg.Pool
) -> None:
    nightly = {"name": "nightly-report", "cron": "0 2 * * *", "timezone": "Asia/Shanghai", "task": "report.build"}
    async with start_instance(schedules=[nightly]) as inst, http(inst) as client:
        listed = await wait_for(lambda: _listed(client))
        [item] = listed
        assert item["name"] == "nightly-report" and item["timezone"] == "Asia/Shanghai"
        assert len(item["next_fires"]) == 5
        first = item["next_fires"][0]
        assert first["utc"].endswith("T18:00:00Z") and first["local"].endswith("T02:00:00+08:00")
        r = await client.post("/api/v1/schedules/nightly-report/trigger")
        assert r.status_code == 201
        task_id = r.json()["task_id"]
        assert r.headers["location"] == f"/api/v1/tasks/{task_id}"
        task = (await client.get(f"/api/v1/tasks/{task_id}")).json()["task"]
        assert task["type"] == "cron" and task["name"] == "report.build"
        r = await client.post("/api/v1/schedules/nightly-report/trigger", json={"idempotency_key": "k-1"})
        assert r.status_code == 201
        r = await client.post("/api/v1/schedules/nightly-report/trigger", json={"idempotency_key": "k-1"})
        assert r.status_code == 200 and r.json()["created"] is False
        r = await client.post("/api/v1/schedules/nightly-report/pause")
        assert r.status_code == 200 and r.json()["paused"] is True and r.json()["next_fires"] == []
        r = await client.post("/api/v1/schedules/nightly-report/resume")
        assert r.status_code == 200 and r.json()["paused"] is False and len(r.json()["next_fires"]) == 5
        r = await client.get("/api/v1/schedules/nightly-report")
        assert r.status_code == 200 and r.json()["last_task_id"] is not None


async def _listed(client: Any) -> list[dict[str, Any]] | None:
    r = await client.get("/api/v1/schedules")
    return r.json()["schedules"] if r.status_code == 200 and r.json()["schedules"] else None


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "detail"),
    [
        ("GET", "/api/v1/schedules/nope", None, 404, "no schedule is named 'nope'"),
        ("POST", "/api/v1/schedules/nope/trigger", None, 404, "no schedule is named 'nope'"),
        ("POST", "/api/v1/schedules/nope/pause", None, 404, "no schedule is named 'nope'"),
        ("POST", "/api/v1/schedules/nope/resume", None, 404, "no schedule is named 'nope'"),
        ("GET", "/api/v1/schedules/a%00b", None, 404, "no schedule is named 'a\\x00b'"),
        ("POST", "/api/v1/schedules/a%20b/pause", None, 404, "no schedule is named 'a b'"),
        ("POST", "/api/v1/schedules/tick/trigger", b"{", 400, None),
        ("POST", "/api/v1/schedules/tick/trigger", b"[]", 422, "body: must be a JSON object"),
        ("POST", "/api/v1/schedules/tick/trigger", b'{"key": 1}', 422, "key: unknown field"),
        (
            "POST",
            "/api/v1/schedules/tick/trigger",
            b'{"idempotency_key": ""}',
            422,
            "idempotency_key: String should have at least 1 character",
        ),
        (
            "POST",
            "/api/v1/schedules/tick/trigger",
            b'{"idempotency_key": 7}',
            422,
            "idempotency_key: Input should be a valid string",
        ),
        (
            "POST",
            "/api/v1/schedules/tick/trigger",
            b'{"idempotency_key": "a\\u0000b"}',
            422,
            "idempotency_key: contains a NUL character",
        ),
    ],
)
async def test_bad_schedule_requests_get_problem_details(
    start_instance: Callable[..., Any],
    report_handler: None,
    clean: asyncpg.Pool,
    method: str,
    path: str,
    body: bytes | None,
    status: int,
    detail: str | None,
) -> None:
    tick = {"name": "tick", "cron": "0 0 1 1 *", "task": "report.build"}
    async with start_instance(schedules=[tick]) as inst, http(inst) as client:
        await wait_for(lambda: _listed(client))
        r = await client.request(method, path, content=body)
        assert r.status_code == status
        assert r.headers["content-type"] == "application/problem+json"
        if detail is not None:
            assert r.json()["detail"] == detail
    assert await clean.fetchval("SELECT count(*) FROM tasks") == 0


async def test_an_instance_refuses_a_schedule_whose_task_has_no_handler(
    make_settings: Callable[..., Any], clean: asyncpg.Pool
) -> None:
    settings = make_settings(schedules=[{"name": "n", "cron": "@daily", "task": "reports.nigthly"}])
    with pytest.raises(ConfigError) as err:
        await supervisor.run(settings, Registry(), signals=False)
    assert str(err.value) == (
        "invalid configuration: schedules[n].task: no handler named 'reports.nigthly' is registered "
        "(import its module through the handlers setting)"
    )
    assert await clean.fetchval("SELECT count(*) FROM schedules") == 0


async def test_resuming_an_active_schedule_keeps_its_due_fire(make: Callable[..., Schedules]) -> None:
    s = make(sched())
    await s.sync(T0)
    view = await s.set_paused("every-minute", False, T0 + timedelta(minutes=5))
    assert view["next_fires"][0]["utc"] == "2026-06-01T12:01:00Z"


async def test_the_list_flags_overdue_rows_and_survives_an_unreadable_one(
    make: Callable[..., Schedules], clean: asyncpg.Pool
) -> None:
    s = make(sched())
    await s.sync(T0 - timedelta(hours=1))  # next fire 11:01, long past at T0
    await clean.execute(
        """INSERT INTO schedules (name, cron, timezone, task, priority, payload, misfire, misfire_grace_seconds,
                                  overlap, enabled, config_hash, next_fire_at)
           VALUES ('martian', '0 2 * * *', 'Mars/Olympus', 't', 0, '{}', 'once', 60, 'allow', true, 'h', now())"""
    )
    listed = {item["name"]: item for item in await s.list()}
    assert listed["every-minute"]["state"] == "overdue"
    assert listed["martian"]["error"] == "unknown time zone 'Mars/Olympus'" and listed["martian"]["next_fires"] == []
    assert await s.fire_due(T0) != []  # the readable one still fires


async def test_a_fire_takes_one_connection_even_when_the_handlers_read_goes_stale_during_it(
    one: OneConnectionPool, stores: Stores
) -> None:
    # A read of the advertised handlers that is never fresh: one made inside the fire's
    # transaction (when the read before it went stale meanwhile, as on a loaded machine)
    # would take a second connection of the pool.
    tasks = Tasks(PgStore(one), stores.redis, metrics=Metrics(), advertised=AdvertisedHandlers(ttl=0))
    s = Schedules(tasks, [sched()])
    await s.sync(T0)
    fires = await s.fire_due(T0 + timedelta(minutes=1))
    assert [f.outcome for f in fires] == ["fired"]


async def test_fires_need_one_pool_connection_only(
    start_instance: Callable[..., Any], report_handler: None, clean: asyncpg.Pool
) -> None:
    # The smallest pool an instance takes is two: the test holds one of them, so that a fire
    # taking a second connection waits for ever (with every other service behind it) and
    # no fire is made, instead of finding the other one free as it nearly always would.
    tick = {"name": "tick", "cron": "* * * * * *", "task": "report.build"}
    async with start_instance(schedules=[tick], pg_pool_size=2) as inst:
        assert inst.state is not None and inst.state.stores is not None
        async with inst.state.stores.pg.pool.acquire():
            before: int = await clean.fetchval("SELECT count(*) FROM tasks WHERE type = 'cron'")
            await wait_for(lambda: _at_least(clean, before + 2), timeout=15)


async def _at_least(pool: asyncpg.Pool, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM tasks WHERE type = 'cron'") >= n)


@pytest.mark.skipif(POOLER != "none", reason="behind a transaction pooler the scheduler polls: no LISTEN to lose")
async def test_losing_the_listen_connection_does_not_stop_the_instance_or_the_schedules(
    start_instance: Callable[..., Any], report_handler: None, clean: asyncpg.Pool
) -> None:
    # A yearly schedule: nothing wakes the scheduler for a minute but a notification, so a
    # fire made due elsewhere is seen at once only through a LISTEN that works.
    yearly = {"name": "yearly", "cron": "0 0 1 1 *", "task": "report.build"}
    listeners = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND query LIKE 'LISTEN%taskmesh_schedules%'"
        " AND pid <> pg_backend_pid()"
    )
    async with start_instance(schedules=[yearly]) as inst, http(inst) as client:
        [first] = await wait_for(lambda: clean.fetch(listeners))
        await clean.execute("SELECT pg_terminate_backend($1)", first["pid"])
        again = await wait_for(lambda: _other_listener(clean, listeners, first["pid"]), timeout=5)
        assert again != first["pid"]
        await clean.execute("UPDATE schedules SET next_fire_at = now() WHERE name = 'yearly'")
        await clean.execute("SELECT pg_notify('taskmesh_schedules', 'test')")
        await wait_for(lambda: _at_least(clean, 1), timeout=3)
        assert (await client.get("/readyz")).status_code == 200


async def _other_listener(pool: asyncpg.Pool, query: str, old: int) -> int | None:
    pids = [r["pid"] for r in await pool.fetch(query) if r["pid"] != old]
    return pids[0] if pids else None


class RecordingClock(ManualClock):
    """A :class:`ManualClock` that records each instant the scheduler sleeps until."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.deadlines: list[datetime] = []

    async def sleep_until(self, when: datetime, waker: Waker) -> None:
        self.deadlines.append(when)
        await super().sleep_until(when, waker)


async def test_a_row_held_by_another_instance_is_not_polled_in_a_busy_loop(
    make: Callable[..., Schedules], clean: asyncpg.Pool
) -> None:
    class Counting(Schedules):
        calls = 0

        async def fire_due(self, now: datetime) -> list[Any]:
            Counting.calls += 1
            return await super().fire_due(now)

    async def slept(n: int) -> bool:
        return len(clock.deadlines) >= n

    base = make(sched("held", "* * * * * *"))
    s = Counting(base.tasks, list(base.declared.values()))
    clock = RecordingClock(T0)
    retry = timedelta(seconds=scheduler.LOCKED_RETRY_SECONDS)
    first_fire = T0.replace(microsecond=0) + timedelta(seconds=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(scheduler.run, s, clock, Waker()))
        await wait_for(lambda: slept(1))  # synced (the held row would block that), looked, asleep
        assert clock.deadlines == [first_fire] and Counting.calls == 1
        async with clean.acquire() as holder, holder.transaction():
            await holder.execute("SELECT 1 FROM schedules WHERE name = 'held' FOR UPDATE")
            clock.set(first_fire + timedelta(seconds=1))
            for look in range(2, 6):
                # Due, yet skipped (held): the next look is a second of the clock away, not at once.
                await wait_for(functools.partial(slept, look))
                assert clock.deadlines[-1] == clock.now() + retry, clock.deadlines
                assert Counting.calls == look
                clock.advance(scheduler.LOCKED_RETRY_SECONDS)
        tg.cancel_scope.cancel()
    assert await cron_keys(clean) == []


async def test_a_row_this_version_cannot_fire_is_skipped_and_the_others_fire(
    make: Callable[..., Schedules], clean: asyncpg.Pool
) -> None:
    s = make(sched(), sched("hourly", "0 * * * *"))
    await s.sync(T0)
    # Edited by hand (or by another version): no task can be made of it.
    await clean.execute("UPDATE schedules SET priority = 5000 WHERE name = 'every-minute'")
    fires = await s.fire_due(T0 + timedelta(hours=1))
    assert [(f.schedule, f.outcome) for f in fires] == [("hourly", "fired")]
    assert set(s.broken) == {"every-minute"} and "priority" in s.broken["every-minute"]
    # Not looked at again (no error every second), and it does not hold up the next due time.
    assert await s.fire_due(T0 + timedelta(hours=2)) != []
    assert await s.next_due() == datetime(2026, 6, 1, 15, 0, tzinfo=UTC)


async def test_schedules_list_their_effective_queue_never_null(
    clean: asyncpg.Pool, stores: Stores, registry: Registry
) -> None:
    @registry.task("report.build", queue="reports")
    async def build(payload: Any) -> None:
        return None

    @registry.task("report.plain")
    async def plain(payload: Any) -> None:
        return None

    tasks = Tasks(PgStore(clean), stores.redis, registry=registry, metrics=Metrics())
    declared = [
        sched("by-handler"),
        ScheduleSettings(name="by-default", cron="* * * * *", task="report.plain"),
        sched("own", queue="urgent"),
    ]
    schedules = Schedules(tasks, declared)
    await schedules.sync(datetime.now(UTC))
    # A row written before rows carried the effective queue (null) is filled at the next sync.
    await clean.execute("UPDATE schedules SET queue = NULL WHERE name = 'by-handler'")
    await schedules.sync(datetime.now(UTC))
    listed = {s["name"]: s["queue"] for s in await schedules.list()}
    assert listed == {"by-handler": "reports", "by-default": "default", "own": "urgent"}
    task_id, _, _ = await schedules.trigger("by-handler")
    assert await clean.fetchval("SELECT queue FROM tasks WHERE id = $1", task_id) == "reports"
