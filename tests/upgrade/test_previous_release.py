"""An instance of the previous release beside this one, through `taskmesh migrate` and a rolling switch.

What a team does on upgrade day: the previous release serves (creates, a schedule firing every
second, cancels, dead letters and their replay); this release's ``taskmesh migrate`` runs beside
it; the previous release keeps doing all of that on the new schema, next to an instance of this
release; then the old instance stops and ``migrate`` runs the contract steps it held back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import asyncpg
import pytest

from taskmesh import __version__
from taskmesh.store.migrator import migrations
from tests.conftest import scratch_database
from tests.proc import Proc, call, free_port, wait_until
from tests.upgrade.release import ROOT, install

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.usefixtures("redis_client")]

PREVIOUS_RELEASE = "e93f40f12a326f0f1481c455e9889e0f44a521e8"
"""0.1.0 as main stood on 2026-12-01, before per-tenant dedup keys (migration 0013): the release
whose instances the upgrade trial saw fail every create once today's migrations committed."""
OUTDATED_PLAN = "plan is invalid due to a database schema or configuration change"
PREVIOUS_SCHEMA = 12
"""The last migration the previous release has."""


STARTED: list[Proc] = []
"""Every process :func:`start` made, killed when the test ends whatever its end."""


def start(python: Path, env: dict[str, str], log: Path) -> Proc:
    """``python -m taskmesh`` with ``env`` (and a free HTTP port), ready (``/readyz`` 200)."""
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_")}
    full.update(env, HTTP_PORT=str(port), PYTHONPATH=str(ROOT), TASKMESH_LOG_FORMAT="json")
    with log.open("wb") as out:
        popen = subprocess.Popen([str(python), "-m", "taskmesh"], env=full, cwd=log.parent, stdout=out, stderr=out)
    proc = Proc(popen, port, log)
    STARTED.append(proc)
    wait_until(lambda: call(port, "GET", "/readyz")[0] == 200, timeout=30, proc=proc)
    return proc


def migrate(python: Path, database_url: str) -> str:
    """``python -m taskmesh migrate``: its output (a failure fails the test)."""
    env = {"DATABASE_URL": database_url, "PATH": os.environ["PATH"]}
    done = subprocess.run([str(python), "-m", "taskmesh", "migrate"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def exercise(proc: Proc, label: str) -> dict[str, str]:
    """Create, dedup, cancel and dead-letter tasks through ``proc``: ``{what: task id}``."""
    ids = {}
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "upgrade.echo", "payload": {"by": label}})
    assert status == 201, body
    ids["plain"] = body["task_id"]
    keyed = {"name": "upgrade.echo", "payload": {"by": label, "keyed": True}, "dedup_key": f"key-{label}"}
    status, body = call(proc.port, "POST", "/api/v1/tasks", keyed)
    assert status == 201, body
    ids["keyed"] = body["task_id"]
    status, again = call(proc.port, "POST", "/api/v1/tasks", keyed)
    assert (status, again["task_id"]) == (200, ids["keyed"]), again
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "upgrade.echo", "delay_seconds": 3600})
    assert status == 201, body
    ids["cancelled"] = body["task_id"]
    status, body = call(proc.port, "POST", f"/api/v1/tasks/{ids['cancelled']}/cancel", {})
    assert status == 200, body
    status, body = call(proc.port, "POST", "/api/v1/tasks", {"name": "upgrade.flaky", "payload": {"flag": label}})
    assert status == 201, body
    ids["replayed"] = body["task_id"]
    return ids


def state(port: int, task_id: str) -> str:
    status, body = call(port, "GET", f"/api/v1/tasks/{task_id}")
    assert status == 200, body
    return str(body.get("task", body)["status"])  # the previous release nests it under "task"


async def check(proc: Proc, pool: asyncpg.Pool, ids: dict[str, str], label: str) -> None:
    """The tasks ``exercise`` made end as they should, the dead letter replayed through ``proc``."""
    for what in ("plain", "keyed"):
        wait_until(lambda what=what: state(proc.port, ids[what]) == "completed", proc=proc)
    assert state(proc.port, ids["cancelled"]) == "cancelled"
    wait_until(lambda: state(proc.port, ids["replayed"]) == "failed", proc=proc)
    await pool.execute("INSERT INTO upgrade_flags VALUES ($1)", label)
    status, body = call(proc.port, "POST", "/api/v1/queues/default/dlq/replay", {"ids": [ids["replayed"]]})
    assert status == 200, body
    wait_until(lambda: state(proc.port, ids["replayed"]) == "completed", proc=proc)


async def fires_since(pool: asyncpg.Pool, since: float, until: float | None = None) -> int:
    """Tasks the every-second schedule created from ``since`` to ``until`` (epoch seconds) that completed."""
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM tasks WHERE name = 'upgrade.tick' AND status = 'completed'"
            " AND created_at > to_timestamp($1) AND created_at < to_timestamp($2)",
            since,
            until or time.time() + 3600,
        )
    )


async def test_the_previous_release_keeps_working_beside_this_one_through_migrate_and_a_rolling_switch(
    store_urls: tuple[str, str], redis_url: str, prefix: str, tmp_path: Path
) -> None:
    old_python = install(PREVIOUS_RELEASE, tmp_path / "previous")
    async with scratch_database(store_urls[0], "tm_upgrade") as database_url:
        assert migrate(old_python, database_url) == f"migrations applied: {list(range(1, PREVIOUS_SCHEMA + 1))}"
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
        try:
            await pool.execute("CREATE TABLE upgrade_flags (flag text PRIMARY KEY)")
            env = {
                "DATABASE_URL": database_url,
                "REDIS_URL": redis_url,
                "TASKMESH_REDIS_PREFIX": prefix,
                "TASKMESH_HANDLERS": "tests.upgrade.handlers",
                "TASKMESH_MIGRATE_ON_START": "false",
                "TASKMESH_SCHEDULES": json.dumps([{"name": "tick", "cron": "* * * * * *", "task": "upgrade.tick"}]),
            }
            old = start(old_python, env, tmp_path / "previous.log")
            before = exercise(old, "old-before")
            await check(old, pool, before, "old-before")

            # This release's migrate beside the running previous release: the expand steps only.
            newer = [m.version for m in migrations() if m.version > PREVIOUS_SCHEMA]
            contract = [m.version for m in migrations() if m.contract]
            out = migrate(Path(sys.executable), database_url)
            lines = out.splitlines()
            assert lines[0] == f"migrations applied: {[v for v in newer if v not in contract]}", out
            assert lines[1].startswith(f"held back until no instance of another version runs: {contract}"), out
            assert "(0.1.0)" in lines[1], out
            migrated = time.time()

            # The previous release on the new schema: creates, dedup, cancels, replays, its fires.
            after = exercise(old, "old-after")
            await check(old, pool, after, "old-after")
            wait_until(lambda: call(old.port, "GET", "/readyz")[0] == 200, proc=old)
            with anyio.fail_after(10):  # the previous release's scheduler alone fires on the new schema
                while await fires_since(pool, migrated) < 2:
                    await anyio.sleep(0.2)
            new = start(Path(sys.executable), env, tmp_path / "new.log")
            beside = exercise(new, "new-beside")
            await check(new, pool, beside, "new-beside")

            # The rolling switch: the old instance stops; the contract steps then apply.
            old.signal(signal.SIGTERM)
            assert old.wait(30) == 0, old.output()[-3000:]
            assert migrate(Path(sys.executable), database_url) == f"migrations applied: {contract}"
            switched = time.time()
            last = exercise(new, "new-after")
            await check(new, pool, last, "new-after")
            with anyio.fail_after(10):
                while await fires_since(pool, switched) < 2:
                    await anyio.sleep(0.2)

            errors = [e for p in (old, new) for e in p.events() if e.get("level") in ("error", "critical")]
            # The previous release takes a plan a migration outdated under its transaction for an
            # error of the fire (this release retries it as an outage); the next fire goes through.
            errors = [e for e in errors if not (e in old.events() and OUTDATED_PLAN in str(e.get("error")))]
            assert errors == [], errors
            runs = await pool.fetch(
                "SELECT task_id, attempt, count(*) AS n FROM task_runs GROUP BY task_id, attempt HAVING count(*) > 1"
            )
            assert runs == []
            indexes = await pool.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'tasks' ORDER BY 1")
            names = {r["indexname"] for r in indexes}
            assert "tasks_idempotency_key_key" not in names and "tasks_dedup_key_keyed" not in names
            assert "tasks_dedup_key" in names
            versions = {r["version"] for r in await pool.fetch("SELECT version FROM workers")}
            assert versions == {"0.1.0", __version__}
            new.signal(signal.SIGTERM)
            assert new.wait(30) == 0, new.output()[-3000:]
        finally:
            await pool.close()
            for proc in STARTED:
                if proc.alive():
                    proc.kill()
            STARTED.clear()
