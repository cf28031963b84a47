"""Bad input is refused at the edge with exact problem+json, and nothing is written (design.md principle 7).

Every case runs against a real instance (PostgreSQL, Redis, HTTP). After each
refused request the ``tasks`` and ``task_runs`` tables are still empty and the
default queue in Redis holds nothing. The expected texts are the ones the code
produces today; the pydantic and orjson messages are asserted verbatim on purpose.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from taskmesh.store.keys import Keys
from taskmesh.tasks.registry import Registry
from tests.conftest import http

pytestmark = pytest.mark.anyio

PROBLEM = "application/problem+json"
LIMIT = 1024 * 1024
NAME_PATTERN = "String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'"
QUEUE_PATTERN = "must match [A-Za-z0-9_.:-]{1,128}"
TOO_DEEP = "nested deeper than 64 levels"
NOT_INT = "Input should be a valid integer"
RFC3339 = "must be an RFC 3339 date-time string"
NUL = "contains a NUL character"
DELAYED = "type 'delayed' needs delay_seconds or run_at"
PRINTABLE = "must be 1 to 128 printable characters"
RUN_AT_AHEAD = "must be at most 365 days ahead (max_delay_seconds, as delay_seconds); any past time means now"
IN_AN_HOUR = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
UNKNOWN_ID = "00000000-0000-0000-0000-000000000000"
TASKS = "/api/v1/tasks"
DLQ = "/api/v1/queues/default/dlq"
REPLAY = "/api/v1/queues/default/dlq/replay"


@dataclass(frozen=True)
class Bad:
    """One bad request and the exact problem it must be answered with.

    ``field``/``message`` are ``errors[0]``; ``None`` means the body has no ``errors``.
    """

    case: str
    method: str
    path: str
    status: int
    title: str
    detail: str
    field: str | None
    message: str | None
    request: dict[str, Any] = dataclasses.field(default_factory=dict)  # the name `field` is a column here


def invalid(case: str, method: str, path: str, fld: str, message: str, **request: Any) -> Bad:
    """A 422 whose detail is ``"<field>: <message>"``."""
    return Bad(case, method, path, 422, "Invalid request", f"{fld}: {message}", fld, message, request)


def no_errors(case: str, method: str, path: str, status: int, title: str, detail: str | None = None) -> Bad:
    """A problem without an ``errors`` list (404, 405); ``detail`` defaults to ``title``."""
    return Bad(case, method, path, status, title, detail or title, None, None)


def bad_task(case: str, body: Any, fld: str, message: str) -> Bad:
    """``POST /api/v1/tasks`` with a JSON body, refused with 422."""
    return invalid(case, "POST", TASKS, fld, message, json=body)


def raw_task(case: str, content: bytes, fld: str, message: str) -> Bad:
    """``POST /api/v1/tasks`` with raw bytes (for JSON ``json=`` cannot produce), refused with 422."""
    return invalid(case, "POST", TASKS, fld, message, content=content)


def malformed(case: str, content: bytes, reason: str, path: str = TASKS) -> Bad:
    """A body orjson cannot parse: 400 with orjson's reason in the detail."""
    detail = f"body: not valid JSON ({reason})"
    return Bad(case, "POST", path, 400, "Malformed JSON", detail, "body", "not valid JSON", {"content": content})


def ge(n: int) -> str:
    return f"Input should be greater than or equal to {n}"


def le(n: int) -> str:
    return f"Input should be less than or equal to {n}"


def nested_dict(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def nested_list(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def deep_payload_bytes(levels: int, *, lists: bool = False) -> bytes:
    """A task body whose payload nests ``levels`` deep, built as bytes (``json.dumps`` recurses)."""
    inner = b"[" * levels + b"]" * levels if lists else b'{"a":' * levels + b"1" + b"}" * levels
    return b'{"name":"x","payload":' + inner + b"}"


def exact_size_body(size: int) -> bytes:
    """A task body of exactly ``size`` bytes carrying an unknown field (so it is refused if read)."""
    head, tail = b'{"name":"x","bogus":"', b'"}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


# -- the cases -------------------------------------------------------------------------------------

MALFORMED = [
    malformed("truncated object", b'{"name": "x"', "unexpected end of data: line 1 column 13 (char 12)"),
    malformed("trailing comma", b'{"name": "x",}', "trailing comma is not allowed: line 1 column 13 (char 12)"),
    malformed("empty body", b"", "Input is a zero-length, empty document: line 1 column 1 (char 0)"),
    malformed("form-encoded body", b"name=x", "invalid literal, expected 'null': line 1 column 1 (char 0)"),
    malformed(
        "NaN literal",
        b'{"name":"x","payload":NaN}',
        "unexpected character, expected a JSON value: line 1 column 23 (char 22)",
    ),
    malformed(
        "infinite number",
        b'{"name":"x","delay_seconds":1e999}',
        "number is infinity when parsed as double: line 1 column 29 (char 28)",
    ),
    malformed(
        "invalid UTF-8",
        b'{"name":"x","payload":"\xff"}',
        "str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)",
    ),
    malformed(
        "lone surrogate escape",
        b'{"name":"x","payload":"\\ud800"}',
        "no low surrogate in string: line 1 column 24 (char 23)",
    ),
    malformed("truncated replay body", b"{", "unexpected end of data: line 1 column 2 (char 1)", path=REPLAY),
]

BAD_TASKS = [
    bad_task("body is a JSON array", [{"name": "x"}], "body", "must be a JSON object"),
    raw_task("body is JSON null", b"null", "body", "must be a JSON object"),
    raw_task("body is a JSON string", b'"x"', "body", "must be a JSON object"),
    bad_task("name missing", {}, "name", "field required"),
    bad_task("name missing but other fields given", {"priority": 1}, "name", "field required"),
    bad_task("name with a space", {"name": "a b"}, "name", NAME_PATTERN),
    bad_task("name of 129 characters", {"name": "a" * 129}, "name", NAME_PATTERN),
    bad_task("empty name", {"name": ""}, "name", NAME_PATTERN),
    bad_task("name with a trailing newline", {"name": "x\n"}, "name", NAME_PATTERN),
    bad_task("name is a number", {"name": 5}, "name", "Input should be a valid string"),
    bad_task("name is null", {"name": None}, "name", "Input should be a valid string"),
    raw_task("duplicate name key, last one bad", b'{"name":"x","name":"y y"}', "name", NAME_PATTERN),
    bad_task("queue_name with a slash", {"name": "x", "queue_name": "a/b"}, "queue_name", NAME_PATTERN),
    bad_task("empty queue_name", {"name": "x", "queue_name": ""}, "queue_name", NAME_PATTERN),
    bad_task(
        "type not a known one", {"name": "x", "type": "later"}, "type", "Input should be 'immediate' or 'delayed'"
    ),
    bad_task("priority a string", {"name": "x", "priority": "high"}, "priority", NOT_INT),
    bad_task("priority a numeric string", {"name": "x", "priority": "5"}, "priority", NOT_INT),
    bad_task("priority a bool", {"name": "x", "priority": True}, "priority", NOT_INT),
    bad_task("priority a fraction", {"name": "x", "priority": 1.5}, "priority", NOT_INT),
    bad_task("priority -1", {"name": "x", "priority": -1}, "priority", ge(0)),
    bad_task("priority 1001", {"name": "x", "priority": 1001}, "priority", le(1000)),
    bad_task("max_retries -1", {"name": "x", "max_retries": -1}, "max_retries", ge(0)),
    bad_task("max_retries 101", {"name": "x", "max_retries": 101}, "max_retries", le(100)),
    bad_task("max_retries a string", {"name": "x", "max_retries": "3"}, "max_retries", NOT_INT),
    bad_task("max_retries a float", {"name": "x", "max_retries": 2.0}, "max_retries", NOT_INT),
    bad_task("dedup_key empty", {"name": "x", "dedup_key": ""}, "dedup_key", "String should have at least 1 character"),
    bad_task(
        "dedup_key of 513 characters",
        {"name": "x", "dedup_key": "k" * 513},
        "dedup_key",
        "String should have at most 512 characters",
    ),
    bad_task("payload nested 65 objects deep", {"name": "x", "payload": nested_dict(65)}, "payload", TOO_DEEP),
    bad_task("payload nested 65 arrays deep", {"name": "x", "payload": nested_list(65)}, "payload", TOO_DEEP),
    raw_task("payload nested 1000 objects deep", deep_payload_bytes(1000), "payload", TOO_DEEP),
    raw_task("payload nested 1000 arrays deep", deep_payload_bytes(1000, lists=True), "payload", TOO_DEEP),
    bad_task("NUL in a payload value", {"name": "x", "payload": {"k": "a\x00b"}}, "payload.k", NUL),
    bad_task("NUL in a payload string", {"name": "x", "payload": "a\x00"}, "payload", NUL),
    bad_task("NUL in a payload array item", {"name": "x", "payload": {"items": [1, "a\x00"]}}, "payload.items[1]", NUL),
    bad_task(
        "NUL in a payload key",
        {"name": "x", "payload": {"k\x00": "v"}},
        "payload.'k\\x00'",
        "key contains a NUL character",
    ),
    bad_task("NUL in dedup_key", {"name": "x", "dedup_key": "a\x00b"}, "dedup_key", NUL),
    bad_task("NUL in name", {"name": "x\x00"}, "name", NUL),
    bad_task("NUL in queue_name", {"name": "x", "queue_name": "q\x00"}, "queue_name", NUL),
    bad_task("NUL in tenant_id", {"name": "x", "tenant_id": "t\x00"}, "tenant_id", NUL),
    # What an API key's tenant may not hold: each would look like "acme" in a list and be another tenant.
    bad_task("zero-width space in tenant_id", {"name": "x", "tenant_id": "ac\u200bme"}, "tenant_id", PRINTABLE),
    bad_task("right-to-left override in tenant_id", {"name": "x", "tenant_id": "\u202eemca"}, "tenant_id", PRINTABLE),
    bad_task("escape character in tenant_id", {"name": "x", "tenant_id": "acme\x1b[0m"}, "tenant_id", PRINTABLE),
    bad_task("line break in tenant_id", {"name": "x", "tenant_id": "acme\n"}, "tenant_id", PRINTABLE),
    bad_task("NUL in trace_id", {"name": "x", "trace_id": "t\x00"}, "trace_id", NUL),
    bad_task("unknown extra field", {"name": "x", "bogus": 1}, "bogus", "unknown field"),
    bad_task("unknown extra field with a NUL in its name", {"name": "x", "bogus\x00": 1}, "bogus\x00", "unknown field"),
    bad_task(
        "several problems, first one named",
        {"name": "x", "priority": 5, "bogus": 1, "max_retries": -1},
        "max_retries",
        ge(0),
    ),
    bad_task("delay_seconds negative", {"name": "x", "delay_seconds": -1}, "delay_seconds", ge(0)),
    bad_task("delay_seconds over a year", {"name": "x", "delay_seconds": 31_536_001}, "delay_seconds", le(31536000)),
    bad_task(
        "delay_seconds a string", {"name": "x", "delay_seconds": "5"}, "delay_seconds", "must be a number of seconds"
    ),
    bad_task(
        "delay_seconds a bool", {"name": "x", "delay_seconds": True}, "delay_seconds", "must be a number of seconds"
    ),
    bad_task(
        "both delay_seconds and run_at",
        {"name": "x", "delay_seconds": 5, "run_at": IN_AN_HOUR},
        "body",
        "give delay_seconds or run_at, not both",
    ),
    bad_task(
        "run_at without a UTC offset",
        {"name": "x", "run_at": "2030-01-01T00:00:00"},
        "run_at",
        "must carry a UTC offset (RFC 3339), e.g. 2026-01-01T12:00:00Z",
    ),
    bad_task("run_at 'tomorrow'", {"name": "x", "run_at": "tomorrow"}, "run_at", RFC3339),
    bad_task("run_at a date only", {"name": "x", "run_at": "2030-01-01"}, "run_at", RFC3339),
    bad_task("run_at a number", {"name": "x", "run_at": 12345}, "run_at", RFC3339),
    bad_task("run_at offset out of range", {"name": "x", "run_at": "2030-01-01T00:00:00+25:00"}, "run_at", RFC3339),
    bad_task("run_at year 99999", {"name": "x", "run_at": "99999-01-01T00:00:00Z"}, "run_at", RFC3339),
    bad_task("type delayed without a delay", {"name": "x", "type": "delayed"}, "body", DELAYED),
    bad_task("type delayed with run_at null", {"name": "x", "type": "delayed", "run_at": None}, "body", DELAYED),
]

BAD_READS = [
    invalid("task id not a UUID", "GET", f"{TASKS}/not-a-uuid", "task_id", "must be a UUID"),
    invalid("runs of a task id not a UUID", "GET", f"{TASKS}/not-a-uuid/runs", "task_id", "must be a UUID"),
    no_errors("unknown task id", "GET", f"{TASKS}/{UNKNOWN_ID}", 404, "Task not found", f"no task has id {UNKNOWN_ID}"),
    no_errors(
        "runs of an unknown task id",
        "GET",
        f"{TASKS}/{UNKNOWN_ID}/runs",
        404,
        "Task not found",
        f"no task has id {UNKNOWN_ID}",
    ),
    invalid("dlq of a queue with a space", "GET", "/api/v1/queues/bad%20queue/dlq", "queue", QUEUE_PATTERN),
    invalid("dlq of a queue of 129 characters", "GET", f"/api/v1/queues/{'q' * 129}/dlq", "queue", QUEUE_PATTERN),
    *(
        invalid(
            f"dlq count={raw!r}", "GET", DLQ, "count", "must be an integer between 1 and 1000", params={"count": raw}
        )
        for raw in ("0", "1001", "abc", "", "-1", "1.5")
    ),
]

BAD_REPLAYS = [
    invalid("replay count 0", "POST", REPLAY, "count", ge(1), json={"count": 0}),
    invalid("replay count 1001", "POST", REPLAY, "count", le(1000), json={"count": 1001}),
    invalid("replay count a string", "POST", REPLAY, "count", NOT_INT, json={"count": "x"}),
    invalid("replay count a bool", "POST", REPLAY, "count", NOT_INT, json={"count": True}),
    invalid(
        "replay override_priority 1001",
        "POST",
        REPLAY,
        "override_priority",
        le(1000),
        json={"override_priority": 1001},
    ),
    invalid("replay override_priority -1", "POST", REPLAY, "override_priority", ge(0), json={"override_priority": -1}),
    invalid(
        "replay override_priority a string",
        "POST",
        REPLAY,
        "override_priority",
        NOT_INT,
        json={"override_priority": "high"},
    ),
    invalid("replay extra field", "POST", REPLAY, "extra", "unknown field", json={"extra": 1}),
    invalid("replay body a JSON array", "POST", REPLAY, "body", "must be a JSON object", json=[1]),
    invalid(
        "replay of a queue with a space", "POST", "/api/v1/queues/bad%20q/dlq/replay", "queue", QUEUE_PATTERN, json={}
    ),
]

BAD_ROUTES = [
    no_errors("unknown route", "GET", "/nope", 404, "Not Found"),
    no_errors("unknown route under the API", "GET", "/api/v1/nope", 404, "Not Found"),
    no_errors("POST to a task", "POST", f"{TASKS}/{UNKNOWN_ID}", 405, "Method Not Allowed"),
    no_errors("PUT to the task list", "PUT", TASKS, 405, "Method Not Allowed"),
    no_errors("PATCH of a task", "PATCH", f"{TASKS}/{UNKNOWN_ID}", 405, "Method Not Allowed"),
]


# -- helpers ---------------------------------------------------------------------------------------


async def assert_nothing_written(pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys, case: str) -> None:
    tasks = await pool.fetchval("SELECT count(*) FROM tasks")
    runs = await pool.fetchval("SELECT count(*) FROM task_runs")
    assert (tasks, runs) == (0, 0), f"{case}: wrote {tasks} task(s) and {runs} run(s)"
    depths = (
        await redis_client.zcard(keys.ready("default")),
        await redis_client.zcard(keys.delayed("default")),
        await redis_client.zcard(keys.dlq("default")),
    )
    assert depths == (0, 0, 0), f"{case}: Redis queue 'default' (ready, delayed, dlq) = {depths}"


def assert_problem(r: httpx.Response, bad: Bad) -> None:
    """The answer is exactly the problem ``bad`` expects."""
    where = f"{bad.case}: {bad.method} {bad.path} answered {r.status_code} {r.text[:500]!r}"
    assert r.status_code == bad.status, where
    assert r.headers["content-type"] == PROBLEM, where
    body = r.json()
    assert body["type"] == "about:blank", where
    assert body["status"] == bad.status, where
    assert body["title"] == bad.title, where
    assert body["detail"] == bad.detail, where
    if bad.field is None:
        assert "errors" not in body, where
    else:
        assert body["errors"][0] == {"field": bad.field, "message": bad.message}, where


@pytest.fixture
async def client(start_instance: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for a fresh instance, shared by every case of one test."""
    async with start_instance() as inst, http(inst) as c:
        yield c


async def check_all(
    client: httpx.AsyncClient, cases: list[Bad], pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    for bad in cases:
        r = await client.request(bad.method, bad.path, **bad.request)
        assert_problem(r, bad)
        await assert_nothing_written(pool, redis_client, keys, bad.case)


# -- the tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cases",
    [
        pytest.param(MALFORMED, id="malformed-json-400"),
        pytest.param(BAD_TASKS, id="invalid-task-422"),
        pytest.param(BAD_READS, id="invalid-reads-422-404"),
        pytest.param(BAD_REPLAYS, id="invalid-replay-422"),
        pytest.param(BAD_ROUTES, id="unknown-routes-404-405"),
    ],
)
async def test_bad_requests_get_the_exact_problem_and_write_nothing(
    client: httpx.AsyncClient, cases: list[Bad], pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    await check_all(client, cases, pool, redis_client, keys)


async def test_bodies_over_1_mib_are_refused_with_413_however_they_are_sent(
    client: httpx.AsyncClient, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    too_big = exact_size_body(LIMIT + 1)

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(too_big), 64 * 1024):
            yield too_big[i : i + 64 * 1024]

    detail = f"body: larger than {LIMIT} bytes"
    message = f"larger than {LIMIT} bytes"
    for path in (TASKS, REPLAY):
        with_length = Bad(
            f"{path} with Content-Length", "POST", path, 413, "Request body too large", detail, "body", message
        )
        r = await client.post(path, content=too_big)
        assert r.request.headers["content-length"] == str(LIMIT + 1)
        assert_problem(r, with_length)
        await assert_nothing_written(pool, redis_client, keys, with_length.case)

        streamed = Bad(f"{path} chunked", "POST", path, 413, "Request body too large", detail, "body", message)
        r = await client.post(path, content=chunked())
        assert "content-length" not in r.request.headers
        assert r.request.headers["transfer-encoding"] == "chunked"
        assert_problem(r, streamed)
        await assert_nothing_written(pool, redis_client, keys, streamed.case)


async def test_a_body_of_exactly_1_mib_passes_the_size_limit_and_reaches_validation(
    client: httpx.AsyncClient, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    body = exact_size_body(LIMIT)
    assert len(body) == LIMIT

    async def chunked() -> AsyncIterator[bytes]:
        yield body[: LIMIT // 2]
        yield body[LIMIT // 2 :]

    cases = [
        invalid("exactly 1 MiB with Content-Length", "POST", TASKS, "bogus", "unknown field", content=body),
        invalid("exactly 1 MiB chunked", "POST", TASKS, "bogus", "unknown field", content=chunked()),
    ]
    await check_all(client, cases, pool, redis_client, keys)


async def test_a_payload_nested_exactly_64_levels_deep_is_accepted(
    client: httpx.AsyncClient, pool: asyncpg.Pool, registry: Registry
) -> None:
    @registry.task("nest.ok")
    async def ok(payload: Any) -> None:
        return None

    for case, payload in (("64 objects", nested_dict(64)), ("64 arrays", nested_list(64))):
        r = await client.post(TASKS, json={"name": "nest.ok", "payload": payload})
        assert r.status_code == 201, f"{case}: {r.status_code} {r.text[:500]}"
        got = await client.get(f"{TASKS}/{r.json()['task_id']}")
        assert got.json()["task"]["payload"] == payload, case
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 2


DEEPER_THAN_ORJSON_ALLOWS = [
    raw_task("payload nested 5000 objects deep", deep_payload_bytes(5000), "payload", TOO_DEEP),
    raw_task("payload nested 5000 arrays deep", deep_payload_bytes(5000, lists=True), "payload", TOO_DEEP),
    raw_task("body nested 5000 arrays deep", b"[" * 5000 + b"]" * 5000, "payload", TOO_DEEP),
    invalid("replay body nested 5000 deep", "POST", REPLAY, "body", TOO_DEEP, content=b"[" * 5000 + b"]" * 5000),
]

# Each of these once answered 500 or 200; they are kept as a group so that the regression stays visible.
EDGE_CASES = [
    bad_task(
        "run_at year 9999 with a negative offset",
        {"name": "x", "run_at": "9999-12-31T23:59:59-01:00"},
        "run_at",
        RUN_AT_AHEAD,
    ),
    invalid(
        "dlq count superscript two", "GET", DLQ, "count", "must be an integer between 1 and 1000", params={"count": "²"}
    ),
    invalid(
        "dlq count arabic-indic three",
        "GET",
        DLQ,
        "count",
        "must be an integer between 1 and 1000",
        params={"count": "٣"},
    ),
    invalid("dlq of a queue with a trailing newline", "GET", "/api/v1/queues/default%0A/dlq", "queue", QUEUE_PATTERN),
    invalid(
        "replay of a queue with a trailing newline",
        "POST",
        "/api/v1/queues/default%0A/dlq/replay",
        "queue",
        QUEUE_PATTERN,
        json={"count": 1},
    ),
]


@pytest.mark.parametrize(
    "cases",
    [
        pytest.param(DEEPER_THAN_ORJSON_ALLOWS, id="nesting-beyond-the-parser-422"),
        pytest.param(EDGE_CASES, id="former-500s-422"),
    ],
)
async def test_pathological_input_gets_a_422_never_a_500(
    client: httpx.AsyncClient, cases: list[Bad], pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    await check_all(client, cases, pool, redis_client, keys)
