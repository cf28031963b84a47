"""Which child runs a call and when: lazy start, reuse, parallelism, the FIFO wait, timeouts, handler references."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from typing import Any

import anyio
import pytest

from taskmesh.runtime.process_child import ChildOutcome
from taskmesh.runtime.process_pool import HandlerRef, ProcessPool
from tests.process_pool import handlers
from tests.process_pool.support import ROOT, both_loops, ref

pytestmark = pytest.mark.anyio


def returned(outcome: ChildOutcome) -> Any:
    assert outcome.kind == "returned" and outcome.result_json is not None, outcome
    return json.loads(outcome.result_json)


async def test_no_child_starts_before_the_first_run() -> None:
    async with ProcessPool(4) as pool:
        await anyio.sleep(0.1)
        assert (pool.alive, pool.busy) == (0, 0)
        returned(await pool.run(ref(handlers.echo), 1, None))
        assert (pool.alive, pool.busy) == (1, 0)


async def test_an_idle_child_is_reused() -> None:
    async with ProcessPool(2) as pool:
        first = returned(await pool.run(ref(handlers.whoami), None, None))
        second = returned(await pool.run(ref(handlers.whoami), None, None))
        assert first == second and pool.alive == 1


@both_loops
async def test_two_cpu_bound_calls_run_at_once_in_a_pool_of_two() -> None:
    spans: list[dict[str, float]] = []

    async def burn() -> None:
        spans.append(returned(await pool.run(ref(handlers.burn_cpu), {"seconds": 0.3}, None)))

    async with ProcessPool(2) as pool:
        # Start both children first: their start-up times differ by more than a burn under load.
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(pool.run, ref(handlers.echo), None, None)
        assert pool.alive == 2
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(burn)
    assert max(s["start"] for s in spans) < min(s["end"] for s in spans), spans


async def test_calls_wait_in_arrival_order_for_the_one_child_of_a_pool_of_one() -> None:
    spans: dict[int, dict[str, float]] = {}

    async def burn(i: int) -> None:
        spans[i] = returned(await pool.run(ref(handlers.burn_cpu), {"seconds": 0.1}, None))

    async with ProcessPool(1) as pool, anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(burn, i)
            await anyio.sleep(0.01)  # arrive in order 0, 1, 2
    assert spans[0]["end"] <= spans[1]["start"] and spans[1]["end"] <= spans[2]["start"], spans


async def test_waiting_for_a_free_child_does_not_count_against_the_timeout() -> None:
    async with ProcessPool(1) as pool, anyio.create_task_group() as tg:
        tg.start_soon(pool.run, ref(handlers.burn_cpu), {"seconds": 0.5}, None)
        with anyio.fail_after(10):
            while pool.busy == 0:
                await anyio.sleep(0.01)
        waited = await pool.run(ref(handlers.echo), "late", None, timeout=0.3)
        assert returned(waited) == "late"


async def test_a_childs_start_up_and_preloads_do_not_count_against_the_timeout() -> None:
    # slow_import takes 0.6 s to import: a child's first call waits for it, the timeout does not.
    async with ProcessPool(1, preload=["tests.process_pool.slow_import"]) as pool:
        outcome = await pool.run(ref(handlers.preloaded), None, None, timeout=0.3)
        assert returned(outcome) is True


async def test_a_preload_that_fails_is_logged_and_the_child_serves_calls(capfd: pytest.CaptureFixture[str]) -> None:
    async with ProcessPool(1, log_format="json", preload=["tests.process_pool.no_such_module"]) as pool:
        assert returned(await pool.run(ref(handlers.echo), "still here", None)) == "still here"
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    failed = [line for line in lines if line["event"] == "handler_module_preload_failed"]
    assert [line["module"] for line in failed] == ["tests.process_pool.no_such_module"]
    assert failed[0]["error"] == "ModuleNotFoundError: No module named 'tests.process_pool.no_such_module'"


def nested() -> Any:
    def inner(payload: Any) -> Any:
        return payload

    return inner


def test_handler_ref_of_names_module_level_functions_and_static_methods() -> None:
    assert HandlerRef.of(handlers.echo) == HandlerRef("tests.process_pool.handlers", "echo")
    assert HandlerRef.of(handlers.Jobs.double) == HandlerRef("tests.process_pool.handlers", "Jobs.double")


def test_handler_ref_of_refuses_closures_lambdas_and_names_that_hold_something_else() -> None:
    assert HandlerRef.of(nested()) is None
    assert HandlerRef.of(lambda payload: payload) is None
    # Same module and qualified name as handlers.echo, but not the object that name holds.
    impostor = types.FunctionType(handlers.echo.__code__, handlers.echo.__globals__, "echo")
    impostor.__qualname__ = "echo"
    assert HandlerRef.of(impostor) is None
    assert HandlerRef.of(handlers.Jobs().double) is not None  # a static method, whichever way it is reached


def test_handler_ref_of_refuses_functions_of_main() -> None:
    script = (
        "from taskmesh.runtime.process_pool import HandlerRef\n"
        "def handler(payload): return payload\n"
        "print(HandlerRef.of(handler))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


async def test_options_out_of_range_are_refused() -> None:
    for bad in ({"size": 0}, {"size": 1, "log_level": "loud"}, {"size": 1, "stop_grace_seconds": 0}):
        with pytest.raises(ValueError):
            ProcessPool(**bad)
    async with ProcessPool(1) as pool:
        with pytest.raises(ValueError):
            await pool.run(ref(handlers.echo), None, None, timeout=0)
