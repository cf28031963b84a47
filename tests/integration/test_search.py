"""Finding tasks: ``GET /api/v1/tasks`` with filters, keyset pages and opaque cursors.

Twelve tasks with known creation times, queues, names, tenants, payloads and
outcomes are searched every way the API allows; pages are walked with their
cursors in both orders; a filter that matches only beyond the window gives a
short ``partial`` page whose cursor goes on; every bad parameter gets its exact
problem.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import http
from tests.integration.test_api_bad_input import Bad, assert_problem, invalid

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"


async def seed(client: httpx.AsyncClient, pool: asyncpg.Pool) -> list[str]:
    """Twelve tasks, oldest first: ``n`` = 0..11 in the payload, a minute apart from 2026-01-01T00:00Z.

    Even ``n``: queue q1, name report.a; odd: queue q2, name report.b. ``n`` < 4: tenant t1.
    ``n`` in (2, 5, 8): failed with error "Printer ON FIRE #n"; ``n`` in (3, 7): completed.
    """
    ids = []
    for n in range(12):
        body: dict[str, Any] = {
            "name": "report.a" if n % 2 == 0 else "report.b",
            "queue_name": "q1" if n % 2 == 0 else "q2",
            "payload": {"customer": {"id": n, "tier": "gold" if n < 6 else "basic"}},
            "dedup_key": f"key-{n}",
        }
        if n < 4:
            body["tenant_id"] = "t1"
        r = await client.post(TASKS, json=body)
        assert r.status_code == 201, r.text
        ids.append(r.json()["task_id"])
    for n, task_id in enumerate(ids):
        await pool.execute(
            "UPDATE tasks SET created_at = '2026-01-01T00:00Z'::timestamptz + $2 * interval '1 minute' WHERE id = $1",
            task_id,
            n,
        )
        if n in (2, 5, 8):
            await _finish(pool, task_id, "failed", f"Printer ON FIRE #{n}", n)
        elif n in (3, 7):
            await _finish(pool, task_id, "completed", None, n)
    return ids


async def _finish(pool: asyncpg.Pool, task_id: str, status: str, error: str | None, n: int) -> None:
    run_status = "failed" if status == "failed" else "succeeded"
    finished = f"2026-02-01T00:{n:02d}:00Z"
    await pool.execute(
        "UPDATE tasks SET status = $2, attempts = 1, updated_at = $3::text::timestamptz WHERE id = $1",
        task_id,
        status,
        finished,
    )
    await pool.execute(
        # A run row is written at the claim: the task gets the one its claim and end would have written.
        "INSERT INTO task_runs (task_id, attempt, status, error, finished_at)"
        " VALUES ($1, 1, $2, $3, $4::text::timestamptz)",
        task_id,
        run_status,
        error,
        finished,
    )


async def found(client: httpx.AsyncClient, ids: list[str], **params: Any) -> list[int]:
    """The ``n`` of every task a search finds, following its cursors."""
    out: list[int] = []
    cursor = None
    for _ in range(20):
        r = await client.get(TASKS, params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        out += [ids.index(t["id"]) for t in body["tasks"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("the cursors never ended")


async def test_every_filter_finds_exactly_its_tasks_newest_first(start_instance: Any, pool: asyncpg.Pool) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        ids = await seed(client, pool)
        cases: dict[str, tuple[dict[str, Any], list[int]]] = {
            "all": ({}, list(range(11, -1, -1))),
            "status failed": ({"status": "failed"}, [8, 5, 2]),
            "two statuses": ({"status": ["failed", "completed"]}, [8, 7, 5, 3, 2]),
            "comma statuses": ({"status": "completed,failed"}, [8, 7, 5, 3, 2]),
            "queue": ({"queue": "q2"}, [11, 9, 7, 5, 3, 1]),
            "name and status": ({"name": "report.a", "status": "failed"}, [8, 2]),
            "tenant": ({"tenant_id": "t1"}, [3, 2, 1, 0]),
            "dedup key": ({"dedup_key": "key-7"}, [7]),
            "payload number": ({"payload.customer.id": "5"}, [5]),
            "payload as string": ({"payload.customer.id": '"5"'}, []),
            "payload text": ({"payload.customer.tier": "gold", "queue": "q1"}, [4, 2, 0]),
            "error, any case": ({"error": "printer on fire"}, [8, 5, 2]),
            "error and tenant": ({"error": "fire #2", "tenant_id": "t1"}, [2]),
            "created range": (
                {"created_after": "2026-01-01T00:02:30Z", "created_before": "2026-01-01T00:06:00+00:00"},
                [5, 4, 3],
            ),
            "finished after": ({"finished_after": "2026-02-01T00:04:00Z"}, [8, 7, 5]),
            "an offset whose + came as a space": ({"created_after": "2026-01-01T01:09:30 01:00"}, [11, 10]),
            "finished before": ({"finished_before": "2026-02-01T00:04:00Z", "limit": "1"}, [3, 2]),
        }
        for case, (params, wanted) in cases.items():
            assert await found(client, ids, **params) == wanted, case
        page = (await client.get(TASKS, params={"status": "failed", "limit": "2"})).json()
    assert page["partial"] is False and page["next_cursor"] is not None
    first = page["tasks"][0]
    assert "payload" not in first and "result" not in first
    assert first["latest_run"]["error"] == "Printer ON FIRE #8" and first["latest_run"]["attempt"] == 1


async def test_pages_walked_with_their_cursors_cover_everything_once_in_both_orders(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        ids = await seed(client, pool)
        newest = await found(client, ids, limit="5")
        oldest = await found(client, ids, order="asc", limit="5")
        last = (await client.get(TASKS, params={"limit": "12"})).json()
        after = (await client.get(TASKS, params={"cursor": last["next_cursor"]})).json()
    assert newest == list(range(11, -1, -1))
    assert oldest == list(range(12))
    assert last["next_cursor"] is not None  # a full page: there may be more
    assert (after["tasks"], after["next_cursor"]) == ([], None)


async def test_a_filter_matching_only_beyond_the_window_gives_a_partial_page_whose_cursor_goes_on(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    # 10,050 queued tasks newer than one failed and one completed task: a page reads at most
    # 10,000 rows of its window's index.
    await pool.execute(
        """INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at, created_at)
           SELECT gen_random_uuid(), 'bulk', 'immediate', 'default', 0, '{}', 3, 'queued', now(),
                  '2026-03-01T00:00:00Z'::timestamptz + g * interval '1 second'
           FROM generate_series(1, 10050) g"""
    )
    await pool.execute(
        """INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at, created_at)
           VALUES (gen_random_uuid(), 'old', 'immediate', 'default', 0, '{}', 3, 'failed', now(), '2026-02-01'),
                  (gen_random_uuid(), 'older', 'immediate', 'default', 0, '{}', 3, 'completed', now(), '2026-01-01')"""
    )
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        # One status but completed is a window of its own index: found on the first page.
        failed = (await client.get(TASKS, params={"status": "failed"})).json()
        first = (await client.get(TASKS, params={"status": "completed"})).json()
        second = (await client.get(TASKS, params={"status": "completed", "cursor": first["next_cursor"]})).json()
    assert ([t["name"] for t in failed["tasks"]], failed["partial"], failed["next_cursor"]) == (["old"], False, None)
    assert (first["tasks"], first["partial"]) == ([], True) and first["next_cursor"]
    assert [t["name"] for t in second["tasks"]] == ["older"]
    assert (second["partial"], second["next_cursor"]) == (False, None)


STATUSES = "must be one of blocked, queued, running, completed, failed, cancelled, skipped"
BAD_SEARCHES = [
    invalid("an unknown filter", "GET", f"{TASKS}?stauts=failed", "stauts", "unknown filter"),
    invalid("an unknown status", "GET", f"{TASKS}?status=done", "status", STATUSES),
    invalid("a queue with a space", "GET", f"{TASKS}?queue=a%20b", "queue", "must match [A-Za-z0-9_.:-]{1,128}"),
    invalid("limit 0", "GET", f"{TASKS}?limit=0", "limit", "must be an integer between 1 and 500"),
    invalid("limit 501", "GET", f"{TASKS}?limit=501", "limit", "must be an integer between 1 and 500"),
    invalid("order sideways", "GET", f"{TASKS}?order=up", "order", "must be desc (newest first) or asc (oldest first)"),
    invalid("a cursor that is not one", "GET", f"{TASKS}?cursor=abc", "cursor", "is not a cursor of a task search"),
    invalid(
        "a time without an offset",
        "GET",
        f"{TASKS}?created_after=2026-01-01T00:00:00",
        "created_after",
        "must be an RFC 3339 time with an offset, e.g. 2026-01-01T12:00:00Z",
    ),
    invalid(
        "a payload path with a space",
        "GET",
        f"{TASKS}?payload.a%20b=1",
        "payload.a b",
        "must be payload.<field>[.<field>...] (letters, digits, _ and -)",
    ),
    invalid(
        "a payload value that is an object",
        "GET",
        f"{TASKS}?payload.a=%7B%7D",
        "payload",
        "a payload filter's value must be a number, a string, true, false or null",
    ),
    invalid("a filter given twice", "GET", f"{TASKS}?queue=a&queue=b", "queue", "given twice"),
    invalid("a NUL in a payload value", "GET", f"{TASKS}?payload.a.b=%00", "payload.a.b", "contains a NUL character"),
    invalid(
        "a NUL escaped in a payload string",
        "GET",
        f"{TASKS}?payload.a=%22%5Cu0000%22",
        "payload.a",
        "contains a NUL character",
    ),
    invalid(
        "a time past year 9999 in UTC",
        "GET",
        f"{TASKS}?created_after=9999-12-31T23:59:59-23:00",
        "created_after",
        "must be between 0001-01-01 and 9999-12-31 in UTC",
    ),
    invalid(
        "a time before year 1 in UTC",
        "GET",
        f"{TASKS}?finished_before=0001-01-01T00:00:00%2B05:00",
        "finished_before",
        "must be between 0001-01-01 and 9999-12-31 in UTC",
    ),
    invalid("an error of 201 characters", "GET", f"{TASKS}?error={'e' * 201}", "error", "must be 1 to 200 characters"),
]


@pytest.mark.parametrize("bad", BAD_SEARCHES, ids=lambda b: b.case)
async def test_a_bad_search_gets_its_exact_problem(bad: Bad, start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        assert_problem(await client.get(bad.path), bad)


async def test_a_cursor_of_the_other_order_is_refused(start_instance: Any, pool: asyncpg.Pool) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        await seed(client, pool)
        cursor = (await client.get(TASKS, params={"limit": "2"})).json()["next_cursor"]
        r = await client.get(TASKS, params={"cursor": cursor, "order": "asc"})
    bad = invalid("other order", "GET", TASKS, "cursor", "is not a cursor of a search in asc order")
    assert_problem(r, bad)


async def test_every_unknown_filter_is_named_at_once(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        r = await client.get(f"{TASKS}?stauts=failed&queu=a&status=failed&stauts=queued&sort=asc")
    assert r.status_code == 422
    assert r.json()["detail"] == "stauts: unknown filter"
    assert r.json()["errors"] == [
        {"field": "stauts", "message": "unknown filter"},
        {"field": "queu", "message": "unknown filter"},
        {"field": "sort", "message": "unknown filter"},
    ]
