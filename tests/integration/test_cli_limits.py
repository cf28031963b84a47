"""``taskmesh limits list|show|set|unset``, as real processes against a real instance.

Each verb is checked for its table, its ``--json`` (the API's own answer), and the exact message and
exit status of each way it can be refused.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.security import keys as api_keys
from taskmesh.tasks.registry import Registry
from tests.cli_support import cli, env, table
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

LIMITS = "/api/v1/limits"


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions, limits")


async def test_limits_set_list_show_and_unset_print_tables_and_their_json_is_the_apis_answer(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    release = anyio.Event()

    @registry.task("cli.hold")
    async def hold(payload: Any) -> None:
        await release.wait()

    configured = {"api": {"task": "cli.hold", "concurrency": 1}}
    async with start_instance(worker_concurrency=4, limits=configured) as inst, http(inst) as client:
        try:
            made = await client.post("/api/v1/tasks:batch", json={"tasks": [{"name": "cli.hold"}] * 2})
            assert made.status_code == 200, made.text

            async def one_waits() -> bool:
                usage = (await client.get(f"{LIMITS}/api")).json()["usage"]
                return bool(usage and usage[0]["waiting"] == 1 and usage[0]["in_use"] == 1)

            await wait_for(one_waits)

            put = await cli(
                inst,
                "limits",
                "set",
                "per-customer",
                "--task",
                "cli.ok",
                "--key",
                "payload.customer",
                "--concurrency",
                "2",
                "--rate",
                "20/s",
                "--burst",
                "5",
            )
            assert (put.code, put.out, put.err) == (
                0,
                "per-customer: set (concurrency 2, rate 20/s, burst 5, task cli.ok, key payload.customer)\n",
                "",
            )
            assert await pool.fetchval("SELECT updated_by IS NULL FROM limits WHERE name = 'per-customer'") is True

            listed = await cli(inst, "limits", "list")
            assert listed.code == 0, listed.err
            header, rows = table(listed.lines())
            assert header == [
                "NAME",
                "SOURCE",
                "QUEUE",
                "TASK",
                "KEY",
                "CONCURRENCY",
                "RATE",
                "BURST",
                "IN USE",
                "WAITING",
            ]
            assert rows == [
                ["api", "config", "any", "cli.hold", "-", "1", "-", "-", "1", "1"],
                ["per-customer", "api", "any", "cli.ok", "payload.customer", "2", "20/s", "5", "0", "0"],
            ]
            as_json = await cli(inst, "limits", "list", "--json")
            assert (as_json.code, as_json.json()) == (0, (await client.get(LIMITS)).json())

            shown = await cli(inst, "limits", "show", "api")
            assert shown.code == 0, shown.err
            for line in (r"source +config", r"queue +any", r"task +cli\.hold", r"key +-", r"concurrency +1", r"set +-"):
                assert re.search(rf"^{line}$", shown.out, re.M), (line, shown.out)
            usage = shown.out.split("holds now\n", 1)[1].splitlines()
            assert table(usage) == (
                ["QUEUE", "KEY", "IN USE", "WAITING", "BACKING OFF UNTIL (UTC)"],
                [["default", "api", "1", "1", "-"]],
            )
            runtime = await cli(inst, "limits", "show", "per-customer")
            assert re.search(r"^set +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", runtime.out, re.M), runtime.out
            assert re.search(r"^rate +20/s$", runtime.out, re.M) and re.search(r"^burst +5$", runtime.out, re.M)
            runtime_json = await cli(inst, "limits", "show", "per-customer", "--json")
            assert runtime_json.json() == (await client.get(f"{LIMITS}/per-customer")).json()

            replaced = await cli(inst, "limits", "set", "api", "--queue", "default", "--concurrency", "3", "--json")
            assert replaced.code == 0, replaced.err
            assert {k: replaced.json()[k] for k in ("queue", "task", "concurrency", "source")} == {
                "queue": "default",
                "task": None,  # a flag left out is unset: set replaces the limit as a whole
                "concurrency": 3,
                "source": "api",
            }

            unset = await cli(inst, "limits", "unset", "api")
            assert (unset.code, unset.out, unset.err) == (0, "api: unset\n", "")
            back = await client.get(f"{LIMITS}/api")
            assert (back.json()["source"], back.json()["concurrency"]) == ("config", 1)
            unset_json = await cli(inst, "limits", "unset", "per-customer", "--json")
            assert (unset_json.code, unset_json.json()) == (0, {"limit": "per-customer", "unset": True})
            assert await pool.fetchval("SELECT count(*) FROM limits") == 0
        finally:
            release.set()


async def test_limits_refusals_exit_with_the_status_and_the_message_of_the_api(
    start_instance: Any, stores: Any
) -> None:
    async with start_instance(workers_enabled=False, limits={"api": {"concurrency": 1}}) as inst:
        none_set = await cli(inst, "limits", "unset", "api")
        assert (none_set.code, none_set.out, none_set.err) == (
            3,
            "",
            "taskmesh: error: Limit not found: no limit named 'api' was set at run time\n",
        )
        unknown = await cli(inst, "limits", "show", "none-such")
        assert (unknown.code, unknown.err) == (3, "taskmesh: error: Limit not found: no limit is named 'none-such'\n")
        sneaky = await cli(inst, "limits", "show", "../queues/default/pause")
        assert (sneaky.code, sneaky.err) == (
            2,
            "taskmesh: error: Invalid request: limit: must match [a-z0-9][a-z0-9_-]{0,63} "
            "(got '../queues/default/pause')\n",
        )
        nothing = await cli(inst, "limits", "set", "api", "--queue", "default")
        assert (nothing.code, nothing.err) == (
            2,
            "taskmesh: error: Invalid request: body: a limit needs concurrency, rate, or both\n",
        )
        bad_rate = await cli(inst, "limits", "set", "api", "--rate", "fast")
        assert (bad_rate.code, bad_rate.err) == (
            2,
            "taskmesh: error: Invalid request: rate: rate 'fast' must look like 20/s, 600/m or 5/h\n",
        )
        zero = await cli(inst, "limits", "set", "api", "--concurrency", "0")
        assert (zero.code, zero.err) == (
            2,
            "taskmesh: error: Invalid request: concurrency: Input should be greater than or equal to 1\n",
        )
        not_a_number = await cli(inst, "limits", "set", "api", "--concurrency", "many")
        assert not_a_number.code == 2 and "Invalid value for '--concurrency'" in not_a_number.err, not_a_number.err

        reader = (await api_keys.create(stores.pg, "reader", ["tasks:read"])).key
        assert inst.state is not None
        inst.state.keys.ttl = 0.1
        await anyio.sleep(0.2)  # the instance learns that a key exists: it no longer runs open
        as_reader = env(TASKMESH_API_KEY=reader)
        read = await cli(inst, "limits", "list", environ=as_reader)
        assert (read.code, read.err) == (0, "")
        refused = await cli(inst, "limits", "set", "api", "--concurrency", "2", environ=as_reader)
        assert (refused.code, refused.err) == (
            1,
            "taskmesh: error: Forbidden: this key lacks the scope 'queues:admin'\n",
        )
        anonymous = await cli(inst, "limits", "unset", "api")
        assert anonymous.code == 1 and anonymous.err.startswith("taskmesh: error: Unauthorized: "), anonymous.err


async def test_limits_list_without_a_limit_says_so_on_stderr(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst:
        listed = await cli(inst, "limits", "list")
    assert (listed.code, listed.err) == (0, "no limit is configured or set\n")
    assert table(listed.lines())[1] == []
