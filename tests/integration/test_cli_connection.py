"""Where the command line's verbs connect: ``--url`` and ``--api-key`` before or after the command, or
from ``TASKMESH_URL`` and ``TASKMESH_API_KEY``; ``schedules`` and ``keys`` through an instance's API
when given a URL (as its key may), through the stores without one; the platform's commands refuse both."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.tasks.registry import Registry
from tests.cli_support import Ran, env, run_cli
from tests.proc import free_port

NIGHTLY = {"name": "nightly-report", "cron": "0 2 * * *", "timezone": "Asia/Shanghai", "task": "report.build"}


def no_stores(**extra: str) -> dict[str, str]:
    """The CLI's environment without the stores' URLs: a verb that works here went through the API."""
    out = env(**extra)
    out.pop("DATABASE_URL", None)
    out.pop("REDIS_URL", None)
    return out


def unreachable(url: str) -> str:
    return (
        f"taskmesh: error: cannot reach the taskmesh API at {url} (Connection refused); is an instance running "
        "there? Point --url or TASKMESH_URL at it\n"
    )


@pytest.fixture
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions")


def test_url_goes_before_or_after_the_command_the_one_after_winning_and_comes_from_the_environment() -> None:
    first, second = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    cases = [
        (("--url", first, "tasks", "list"), {}, first),  # global, as --api-key always was
        (("tasks", "list", "--url", first), {}, first),  # after the command, as before
        (("--url", first, "workers", "--url", second), {}, second),  # the command's own wins
        (("--url", second, "queues", "list"), {"TASKMESH_URL": first}, second),  # a flag beats the environment
        (("dlq", "list", "emails"), {"TASKMESH_URL": first}, first),
        (("workflows", "list", "--url", first), {}, first),
        (("limits", "set", "api", "--concurrency", "2"), {"TASKMESH_URL": first}, first),
        (("--url", first, "schedules", "list"), {}, first),  # schedules and keys too: through the API
        (("schedules", "trigger", "nightly"), {"TASKMESH_URL": first}, first),
        (("keys", "list"), {"TASKMESH_URL": first}, first),
        (("keys", "revoke", "aaaaaaaaaaaaaaaa", "--url", first), {}, first),
    ]
    for args, extra, url in cases:
        ran = run_cli(*args, environ=no_stores(**extra))
        assert (ran.code, ran.out, ran.err) == (5, "", unreachable(url)), (args, extra)


def test_the_platforms_commands_refuse_url_and_api_key_on_their_command_line_but_not_in_the_environment() -> None:
    for args in (("--url", "http://127.0.0.1:9", "migrate"), ("--api-key", "tmk_x", "dev"), ("--url", "http://h")):
        ran = run_cli(*args, environ=no_stores())
        assert ran.code == 2, (args, ran.err)
        flag, command = args[0], args[2] if len(args) > 2 else "run"
        assert (
            f"Invalid value for '{flag}': {flag} is for the commands that talk to an instance's API (tasks, "
            f"workflows, queues, limits, dlq, workers, bulk, schedules, keys); `taskmesh {command}` runs the platform "
            "on the stores of its configuration"
        ) in ran.err, ran.err
    exported = run_cli("migrate", environ=no_stores(TASKMESH_URL="http://h:1", TASKMESH_API_KEY="tmk_x"))
    assert (exported.code, exported.err) == (
        2,
        "taskmesh: error: DATABASE_URL not set: set it in the environment or in taskmesh.toml (database_url)\n",
    )


def test_schedules_and_keys_without_a_url_or_the_stores_say_what_to_set() -> None:
    for verb, needs in (
        ("schedules", "schedules needs an instance's API (--url or TASKMESH_URL) or the deployment's stores"),
        ("keys", "keys needs an instance's API (--url or TASKMESH_URL, with a key holding keys:admin) or the"),
    ):
        for url in ({}, {"TASKMESH_URL": ""}):  # an empty TASKMESH_URL is none: the way to the stores when exported
            ran = run_cli(verb, "list", environ=no_stores(**url))
            assert ran.code == 2 and ran.err.startswith(f"taskmesh: error: {needs}"), (url, ran.err)


@pytest.mark.anyio
@pytest.mark.usefixtures("no_keys_left")
async def test_schedules_and_keys_given_a_url_go_through_the_api_as_its_key_may(
    start_instance: Any, registry: Registry, stores: Any, pool: asyncpg.Pool
) -> None:
    @registry.task("report.build")
    async def build(payload: Any) -> None:
        return None

    await pool.execute("TRUNCATE schedules")
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    viewer = (await api_keys.create(stores.pg, "viewer", ["tasks:read", "workers:read"])).key
    async with start_instance(schedules=[NIGHTLY]) as inst:
        url = f"http://127.0.0.1:{inst.port}"

        async def cli(*args: str, key: str | None = None) -> Ran:
            extra = {"TASKMESH_URL": url} | ({"TASKMESH_API_KEY": key} if key else {})
            return await anyio.to_thread.run_sync(lambda: run_cli(*args, environ=no_stores(**extra)))

        listed = await cli("schedules", "list", "--json", key=viewer)
        assert listed.code == 0, listed.err
        assert [s["name"] for s in listed.json()["schedules"]] == ["nightly-report"]
        refused = await cli("schedules", "pause", "nightly-report", key=viewer)
        assert (refused.code, refused.out) == (1, "") and refused.err.startswith("taskmesh: error: Forbidden"), refused
        assert await pool.fetchval("SELECT paused FROM schedules") is False
        paused = await anyio.to_thread.run_sync(
            lambda: run_cli("--url", url, "--api-key", admin, "schedules", "pause", "nightly-report", "--json")
        )
        assert paused.code == 0 and paused.json()["paused"] is True, paused.err
        resumed = await anyio.to_thread.run_sync(
            lambda: run_cli("schedules", "resume", "nightly-report", "--url", url, "--api-key", admin)
        )
        assert (resumed.code, resumed.out) == (0, "nightly-report: active\n"), resumed.err
        fired = await cli("schedules", "trigger", "nightly-report", "--idempotency-key", "cli-1", "--json", key=admin)
        assert fired.code == 0, fired.err
        assert (fired.json()["created"], fired.json()["idempotency_key"]) == (True, "cron:nightly-report:trigger:cli-1")
        missing = await cli("schedules", "trigger", "nope", key=admin)
        assert (missing.code, missing.err) == (3, "taskmesh: error: Schedule not found: no schedule is named 'nope'\n")
        actors = await pool.fetch(
            "SELECT action, actor_type, actor_id, resource_id, outcome FROM audit_events "
            "WHERE resource_type = 'schedule' ORDER BY at, id"
        )
        admin_id, viewer_id = admin[4:20], viewer[4:20]
        assert [tuple(a) for a in actors] == [  # the API's records, naming the key: no "cli" actor
            ("schedule.pause", "key", viewer_id, "nightly-report", "denied"),
            ("schedule.pause", "key", admin_id, "nightly-report", "ok"),
            ("schedule.resume", "key", admin_id, "nightly-report", "ok"),
            ("schedule.trigger", "key", admin_id, "nightly-report", "ok"),
            ("schedule.trigger", "key", admin_id, "nope", "error"),
        ]

        made = await cli("keys", "create", "--name", "ci", "--role", "viewer", "--expires-in", "1h", key=admin)
        assert made.code == 0, made.err
        ci_id = made.out.strip()[4:20]
        assert made.err.startswith(f"key {ci_id} for ci: tasks:read, workers:read; it is shown once")
        keys = (await cli("keys", "list", "--json", key=admin)).json()["keys"]
        assert {(k["name"], k["state"]) for k in keys} == {("admin", "active"), ("viewer", "active"), ("ci", "active")}
        rotated = await cli("keys", "rotate", ci_id, "--overlap", "1h", "--json", key=admin)
        assert rotated.code == 0, rotated.err
        assert (rotated.json()["replaces"], rotated.json()["state"]) == (ci_id, "active")
        revoked = await cli("keys", "revoke", rotated.json()["key_id"], "--json", key=admin)
        assert (revoked.code, revoked.json()["state"]) == (0, "revoked"), revoked.err
        unknown = await cli("keys", "revoke", "aaaaaaaaaaaaaaaa", key=admin)
        assert (unknown.code, unknown.err) == (3, "taskmesh: error: Key not found: no key has id aaaaaaaaaaaaaaaa\n")
        not_admin = await cli("keys", "list", key=viewer)
        assert not_admin.code == 1 and not_admin.err.startswith("taskmesh: error: Forbidden"), not_admin.err
        made_by = await pool.fetchval("SELECT actor_id FROM audit_events WHERE action = 'key.create'")
        assert made_by == admin_id

        # The operator verbs take the key after the command too.
        without = await anyio.to_thread.run_sync(lambda: run_cli("workers", "--url", url, environ=no_stores()))
        assert without.code == 1 and "(give the key in TASKMESH_API_KEY or with taskmesh --api-key)" in without.err
        after = await anyio.to_thread.run_sync(
            lambda: run_cli("workers", "--url", url, "--api-key", viewer, "--json", environ=no_stores())
        )
        assert after.code == 0 and len(after.json()["workers"]) == 1, after.err
