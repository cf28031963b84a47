"""What a call in a handler process returns: results, errors, tracebacks, non-retryable cases, log keys."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from taskmesh.runtime.process_child import MAX_TRACEBACK_BYTES
from taskmesh.runtime.process_pool import ProcessPool
from taskmesh.tasks.models import ClaimedTask
from tests.process_pool import handlers
from tests.process_pool.support import both_loops, ref

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[ProcessPool]:
    # One pool for the module: its child survives every outcome here (the tests check it does).
    async with ProcessPool(1, log_level="info", log_format="json", preload=["tests.process_pool.handlers"]) as p:
        yield p


async def pid_of_child(pool: ProcessPool) -> int:
    outcome = await pool.run(ref(handlers.whoami), None, None)
    assert outcome.kind == "returned" and outcome.result_json is not None
    pid: int = json.loads(outcome.result_json)
    return pid


def claimed(attempt: int = 2) -> ClaimedTask:
    return ClaimedTask(
        task_id=uuid.uuid4(),
        run_id=uuid.uuid4(),
        name="reports.export",
        queue="reports",
        priority=0,
        payload={"marker": "m-1"},
        attempt=attempt,
        retries=attempt - 1,
        max_retries=3,
        idempotency_key=None,
        trace_id="0af7651916cd43dd8448eb211c80319c",
        tenant_id=None,
    )


@both_loops
async def test_a_returned_value_comes_back_as_json_text() -> None:
    payload = {"a": [1, "x", None], "b": 2.5}
    async with ProcessPool(1) as pool:  # its own: the module's pool lives on one event loop
        outcome = await pool.run(ref(handlers.echo), payload, None)
    assert outcome.kind == "returned"
    assert outcome.result_json is not None and json.loads(outcome.result_json) == payload
    assert outcome.error is None and outcome.traceback is None
    assert 0 <= outcome.duration_seconds < 5


async def test_the_payload_is_decoded_into_the_handlers_pydantic_model(pool: ProcessPool) -> None:
    outcome = await pool.run(ref(handlers.order_total), {"order_id": "7"}, None)
    assert outcome.kind == "returned" and outcome.result_json is not None
    assert json.loads(outcome.result_json) == {"order_id": 7, "type": "Order"}


async def test_a_payload_that_does_not_fit_the_model_is_a_non_retryable_failure(pool: ProcessPool) -> None:
    outcome = await pool.run(ref(handlers.order_total), {"order_id": "seven"}, None)
    assert outcome.kind == "raised" and outcome.retryable is False
    assert outcome.error is not None and outcome.error.startswith("payload does not fit the handler: ")
    assert "order_id" in outcome.error


async def test_ctx_is_passed_to_a_handler_that_declares_it(pool: ProcessPool) -> None:
    task = claimed(attempt=3)
    outcome = await pool.run(ref(handlers.with_ctx), None, task.context(), run=task, worker_id="w-1")
    assert outcome.kind == "returned" and outcome.result_json is not None
    assert json.loads(outcome.result_json) == {"attempt": 3, "task_id": str(task.task_id)}


async def test_the_handlers_log_lines_carry_the_runs_keys(capfd: pytest.CaptureFixture[str]) -> None:
    # A pool of its own: its child inherits the captured stderr, which capfd reads.
    task = claimed()
    async with ProcessPool(1, log_level="info", log_format="json") as pool:
        outcome = await pool.run(ref(handlers.log_a_line), {"marker": "m-1"}, None, run=task, worker_id="w-7")
    assert outcome.kind == "returned", outcome
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    said = [line for line in lines if line.get("event") == "handler_said_hello"]
    assert len(said) == 1, lines
    assert said[0]["marker"] == "m-1" and said[0]["level"] == "info"
    assert {k: said[0][k] for k in ("task_id", "task_name", "queue", "attempt", "trace_id", "worker_id")} == {
        "task_id": str(task.task_id),
        "task_name": "reports.export",
        "queue": "reports",
        "attempt": 2,
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "worker_id": "w-7",
    }


async def test_a_raised_error_is_one_line_and_its_traceback_starts_at_the_handler(pool: ProcessPool) -> None:
    outcome = await pool.run(ref(handlers.fail), {"message": "bad\nsecond line"}, None)
    assert outcome.kind == "raised" and outcome.retryable is True and outcome.retry_delay is None
    assert outcome.error == "ValueError: bad …"
    assert outcome.traceback is not None
    assert outcome.traceback.startswith("Traceback (most recent call last):\n")
    assert 'handlers.py", line' in outcome.traceback and "in fail\n" in outcome.traceback
    assert "process_child.py" not in outcome.traceback
    assert outcome.traceback.endswith("ValueError: bad\nsecond line\n")


async def test_a_long_traceback_is_cut_to_16_kib_keeping_the_innermost_frames(pool: ProcessPool) -> None:
    outcome = await pool.run(ref(handlers.fail_deep), {"depth": 300, "message": "deep down"}, None)
    assert outcome.kind == "raised" and outcome.traceback is not None
    size = len(outcome.traceback.encode())
    assert size <= MAX_TRACEBACK_BYTES
    first, _, rest = outcome.traceback.partition("\n")
    assert first.startswith("[") and first.endswith(" earlier bytes of the traceback cut]")
    assert int(first[1:].split()[0]) > 40_000  # 600 frames were there to cut
    assert rest.startswith(("  File ", "    "))  # cut at a line boundary: a frame line or its source line
    assert "in innermost_frame_marker\n" in outcome.traceback
    assert outcome.traceback.endswith("RuntimeError: deep down\n")


async def test_a_long_message_is_cut_to_2000_characters(pool: ProcessPool) -> None:
    outcome = await pool.run(ref(handlers.fail), {"message": "x" * 5000}, None)
    assert outcome.error is not None and len(outcome.error) <= 2000
    assert outcome.error.startswith("ValueError: xxxx")


async def test_non_retryable_error_is_not_retryable(pool: ProcessPool) -> None:
    outcome = await pool.run(ref(handlers.refuse), None, None)
    assert (outcome.kind, outcome.error, outcome.retryable) == ("raised", "NonRetryableError: no such customer", False)


async def test_retry_carries_its_delay(pool: ProcessPool) -> None:
    outcome = await pool.run(ref(handlers.retry_later), None, None)
    assert (outcome.kind, outcome.error, outcome.retryable) == ("raised", "Retry: rate limited", True)
    assert outcome.retry_delay == 30.0


@pytest.mark.parametrize(
    ("handler", "detail"),
    [
        pytest.param(handlers.unserialisable, "Type is not JSON serializable: object", id="object"),
        pytest.param(handlers.lone_surrogate, "str is not valid UTF-8: surrogates not allowed", id="lone-surrogate"),
    ],
)
async def test_a_result_orjson_refuses_is_a_non_retryable_failure_and_the_child_lives_on(
    pool: ProcessPool, handler: Any, detail: str
) -> None:
    pid = await pid_of_child(pool)
    outcome = await pool.run(ref(handler), None, None)
    assert (outcome.kind, outcome.retryable) == ("raised", False)
    assert outcome.error == f"handler result is not JSON-serialisable: {detail}"
    assert await pid_of_child(pool) == pid


async def test_an_exception_whose_str_raises_is_reported_and_the_child_lives_on(pool: ProcessPool) -> None:
    pid = await pid_of_child(pool)
    outcome = await pool.run(ref(handlers.fail_badly), None, None)
    assert (outcome.kind, outcome.error) == ("raised", "BadStr: <exception str() failed>")
    assert outcome.traceback is not None and "in fail_badly\n" in outcome.traceback
    assert await pid_of_child(pool) == pid


async def test_sys_exit_in_a_handler_is_a_raised_error_not_a_dead_child(pool: ProcessPool) -> None:
    pid = await pid_of_child(pool)
    outcome = await pool.run(ref(handlers.exit_the_handler), None, None)
    assert (outcome.kind, outcome.error) == ("raised", "SystemExit: 4")
    assert await pid_of_child(pool) == pid


async def test_lone_surrogates_and_nul_in_an_error_are_escaped(pool: ProcessPool) -> None:
    outcome = await pool.run(ref(handlers.fail_with_surrogate), None, None)
    assert outcome.error == "ValueError: bad \\ud800 and nul \\x00 here"
    assert outcome.traceback is not None and outcome.traceback.endswith("ValueError: bad \\ud800 and nul \\x00 here\n")
    outcome.traceback.encode()  # storable: no lone surrogate left


async def test_an_async_handler_is_refused_as_non_retryable(pool: ProcessPool) -> None:
    outcome = await pool.run(ref(handlers.coroutine_handler), None, None)
    assert (outcome.kind, outcome.retryable) == ("raised", False)
    assert outcome.error is not None and "is async" in outcome.error


async def test_a_payload_that_cannot_be_pickled_fails_without_starting_a_child() -> None:
    async with ProcessPool(1) as pool:
        outcome = await pool.run(ref(handlers.echo), lambda: None, None)
        assert pool.alive == 0
    assert (outcome.kind, outcome.retryable) == ("raised", False)
    assert outcome.error is not None and outcome.error.startswith("payload cannot be sent to a handler process: ")
