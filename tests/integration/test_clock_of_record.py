"""PostgreSQL's clock is the clock of record for due times and fires.

The claim checks ``run_at <= now()`` in PostgreSQL, so ``run_at``, ``delay_seconds``
and the scheduler's "now" must come from PostgreSQL's clock too: an instance whose
host clock is wrong must not make an immediate task wait out its error, run a
delayed one early, or fire a schedule early or late. The process tests run a real
instance under libfaketime (Debian package ``faketime``, which ``make deploy-tools``
installs; without it they skip and say so) with its wall clock 10 minutes fast, and
10 minutes slow; its monotonic clock stays real (``FAKETIME_DONT_FAKE_MONOTONIC``).
Every instant compared is PostgreSQL's: the rows' ``created_at``, ``run_at``,
``started_at`` and fire keys, and ``now()``.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.runtime.clock import StoreClock
from taskmesh.store import PgStore
from tests.proc import Proc, call, spawn, stop, stores_env, wait_until
from tests.tools import require_tool

__all__ = ["spawn"]  # a fixture, used by name

pytestmark = pytest.mark.anyio

SKEW_SECONDS = 600.0


async def test_the_store_clock_measures_no_offset_against_postgresql_on_the_same_host(pool: asyncpg.Pool) -> None:
    clock = StoreClock()
    offset = await clock.sync(PgStore(pool).now)
    assert abs(offset) < 0.05, offset
    assert clock.offset == offset
    store_now: datetime = await pool.fetchval("SELECT clock_timestamp()")
    assert abs((clock.now() - store_now).total_seconds()) < 0.05
    assert clock.now().tzinfo is not None


async def test_the_store_clock_reads_a_store_ten_minutes_ahead_as_ten_minutes_ahead() -> None:
    async def ten_minutes_ahead() -> datetime:
        return datetime.now(UTC) + timedelta(seconds=SKEW_SECONDS)

    clock = StoreClock()
    assert clock.offset == 0.0  # before the first sync: the host's clock
    offset = await clock.sync(ten_minutes_ahead)
    assert offset == pytest.approx(SKEW_SECONDS, abs=0.05)
    assert (clock.now() - datetime.now(UTC)).total_seconds() == pytest.approx(SKEW_SECONDS, abs=0.05)
    assert clock.now_ms() - time.time() * 1000 == pytest.approx(SKEW_SECONDS * 1000, abs=50)
    assert clock.timestamp() - time.time() == pytest.approx(SKEW_SECONDS, abs=0.05)


def _events(proc: Proc, name: str) -> list[dict[str, Any]]:
    return [e for e in proc.events() if e.get("event") == name]


@pytest.mark.slow
@pytest.mark.parametrize("skew", ["+10m", "-10m"], ids=["ten-minutes-fast", "ten-minutes-slow"])
@pytest.mark.usefixtures("redis_client")
async def test_an_instance_with_a_wrong_clock_keeps_due_times_and_fires_on_postgresqls_clock(
    spawn: Any, database_url: str, redis_url: str, prefix: str, pool: asyncpg.Pool, skew: str
) -> None:
    faketime = require_tool("faketime", "Debian package faketime", "an instance with a wrong host clock was not run")
    sign = 1 if skew.startswith("+") else -1
    await pool.execute("TRUNCATE schedules")
    schedules = json.dumps([{"name": "tick", "cron": "* * * * * *", "task": "noop"}])
    env = stores_env(database_url, redis_url, prefix, TASKMESH_SCHEDULES=schedules, FAKETIME_DONT_FAKE_MONOTONIC="1")
    proc: Proc = spawn(wrap=[faketime, "-f", skew], **env)
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=20, proc=proc)

    # The premise: the instance's own clock is 10 minutes off PostgreSQL's (its log's timestamps).
    [starting] = _events(proc, "instance_starting")
    logged_at = datetime.fromisoformat(starting["timestamp"].replace("Z", "+00:00"))
    store_now: datetime = await pool.fetchval("SELECT clock_timestamp()")
    assert (logged_at - store_now).total_seconds() == pytest.approx(sign * SKEW_SECONDS, abs=30)

    # An immediate task made through this instance runs at once, not 10 minutes later.
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "noop"})
    assert status == 201, body
    immediate = body["task_id"]
    await _until(lambda: _completed(pool, immediate), 5, proc)
    row = await _timing(pool, immediate)
    assert row["run_at"] == row["created_at"]
    assert (row["started_at"] - row["created_at"]).total_seconds() < 2.0, dict(row)
    # ... and its wait in the queue is measured as such, not as the two clocks' difference.
    waited_count, waited_sum = _queue_wait(proc.port, "noop")
    assert waited_count >= 1 and waited_sum / waited_count < 2.0, (waited_count, waited_sum)

    # A task delayed 2 s is due 2 s after it was made by PostgreSQL's clock: not run before, run soon after.
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "noop", "delay_seconds": 2})
    assert status == 201, body
    delayed = body["task_id"]
    await _until(lambda: _completed(pool, delayed), 6, proc)
    row = await _timing(pool, delayed)
    waited = (row["started_at"] - row["created_at"]).total_seconds()
    assert 2.0 <= waited < 4.0, dict(row)
    assert (row["run_at"] - row["created_at"]).total_seconds() == pytest.approx(2.0, abs=0.01), dict(row)

    # The every-second schedule fires at PostgreSQL's instants: each task made within a second
    # and a half after the instant its key names, never before it (not 10 minutes off either way).
    async def fired_three() -> bool:
        made: int = await pool.fetchval("SELECT count(*) FROM tasks WHERE idempotency_key LIKE 'cron:tick:%'")
        return made >= 3

    await _until(fired_three, 6, proc)
    rows = await pool.fetch(
        "SELECT idempotency_key, created_at FROM tasks WHERE idempotency_key LIKE 'cron:tick:%' ORDER BY created_at"
    )
    for r in rows:
        fire_at = _fire_at(r["idempotency_key"])
        late = (r["created_at"] - fire_at).total_seconds()
        assert -0.05 <= late < 1.5, (r["idempotency_key"], r["created_at"])
    schedule = await pool.fetchrow("SELECT last_fire_at, next_fire_at, now() AS now FROM schedules WHERE name = 'tick'")
    assert schedule is not None
    assert 0 <= (schedule["now"] - schedule["last_fire_at"]).total_seconds() < 2.0, dict(schedule)
    assert 0 < (schedule["next_fire_at"] - schedule["now"]).total_seconds() <= 1.0 + 0.05, dict(schedule)

    # Through this instance's API the schedule reads as active (not overdue by its host's clock),
    # and a pause and resume picks up at PostgreSQL's next second: no fire 10 minutes off, and
    # none of the fires missed while paused.
    status, view = call(proc.port, "GET", "/api/v1/schedules/tick")
    assert (status, view["state"]) == (200, "active"), view
    status, view = call(proc.port, "POST", "/api/v1/schedules/tick/pause")
    assert (status, view["state"]) == (200, "paused"), view
    await anyio.sleep(1.5)
    resumed_at: datetime = await pool.fetchval("SELECT clock_timestamp()")
    status, view = call(proc.port, "POST", "/api/v1/schedules/tick/resume")
    assert (status, view["state"]) == (200, "active"), view
    first = datetime.fromisoformat(view["next_fires"][0]["utc"].replace("Z", "+00:00"))
    assert 0 < (first - resumed_at).total_seconds() <= 1.5, (resumed_at, view["next_fires"][0])
    await anyio.sleep(2.5)
    after = await pool.fetch(
        "SELECT idempotency_key FROM tasks WHERE idempotency_key LIKE 'cron:tick:%' AND created_at > $1", resumed_at
    )
    fired_after = sorted(_fire_at(r["idempotency_key"]) for r in after)
    assert 1 <= len(fired_after) <= 3 and fired_after[0] > resumed_at, (resumed_at, fired_after)

    # The instance says, once, that its host's clock is off (it keeps working on PostgreSQL's).
    [skewed] = _events(proc, "clock_skew")
    assert skewed["offset_s"] == pytest.approx(-sign * SKEW_SECONDS, abs=30)
    code, _, output = stop(proc, 20)
    assert code == 0, output[-3000:]
    assert len(_events(proc, "clock_skew")) == 1


def _fire_at(key: str) -> datetime:
    return datetime.fromisoformat(key.removeprefix("cron:tick:").replace("Z", "+00:00"))


def _queue_wait(port: int, task_name: str) -> tuple[float, float]:
    """``taskmesh_queue_wait_seconds`` of ``task_name`` from the instance's ``/metrics``: ``(count, sum)``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        for part in ("count", "sum"):
            prefix = f"taskmesh_queue_wait_seconds_{part}{{"
            if line.startswith(prefix) and f'task_name="{task_name}"' in line:
                found[part] = float(line.rsplit(" ", 1)[1])
    return found.get("count", 0.0), found.get("sum", 0.0)


async def _until(check: Callable[[], Awaitable[Any]], timeout: float, proc: Proc) -> Any:
    """Poll ``check`` until truthy; fail after ``timeout`` s, or at once when the instance exited (with its log)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if not proc.alive():
            raise AssertionError(f"the instance exited with {proc.popen.returncode}:\n{proc.output()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not within {timeout} s (last value {value!r}); instance log:\n{proc.output()[-3000:]}"
            )
        await anyio.sleep(0.02)


async def _completed(pool: asyncpg.Pool, task_id: str) -> bool:
    status: str | None = await pool.fetchval("SELECT status FROM tasks WHERE id = $1", uuid.UUID(task_id))
    return status == "completed"


async def _timing(pool: asyncpg.Pool, task_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT t.created_at, t.run_at, r.started_at FROM tasks t JOIN task_runs r ON r.task_id = t.id"
        " WHERE t.id = $1 AND r.attempt = 1",
        uuid.UUID(task_id),
    )
    assert row is not None
    return row
