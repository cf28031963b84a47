"""Bulk actions from the console in a real browser: a mistyped confirmation keeps the dry run, and the
operation's page follows a running operation batch by batch.

Headless Chromium against a real instance on real stores, as in ``test_console_browser.py``.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest

from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from tests.conftest import http
from tests.console.conftest import go, in_browser, screenshot
from tests.console.test_console_browser import bearer, sign_in, text

pytestmark = pytest.mark.anyio

FOLLOWED_FETCHES = 3
"""Refreshes of a running operation's page that must come within :data:`FOLLOW_WINDOW_SECONDS`."""
FOLLOW_WINDOW_SECONDS = 4.0
"""A window shorter than the other live pages' 5 s: only a page that follows an operation sooner passes."""


async def make(client: httpx.AsyncClient, key: str, queue: str, n: int) -> None:
    for first in range(0, n, 1000):  # a batch holds 1,000 tasks at most
        made = await client.post(
            "/api/v1/tasks:batch",
            json={"tasks": [{"name": "export.csv", "queue_name": queue} for _ in range(min(1000, n - first))]},
            headers=bearer(key),
        )
        assert made.status_code in (200, 201), made.text


async def test_a_mistyped_confirmation_keeps_the_filters_the_dry_run_and_the_reason(
    start_instance: Any, stores: Any, pool: asyncpg.Pool, page: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        await make(client, admin, "reports", 3)
        await make(client, admin, "other", 2)
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            sign_in(page, base, admin)
            page.get(f"{base}/console/tasks?queue=reports&status=queued")
            page.find_element(By.CSS_SELECTOR, "#bulk select[name=action] option[value=cancel]").click()
            go(page, page.find_element(By.CSS_SELECTOR, "#bulk button[name=dry_run]"))
            assert text(page, "#matched") == "3"
            page.find_element(By.NAME, "reason").send_keys("reports are rebuilt tonight")
            page.find_element(By.NAME, "confirm").send_keys("cancle")
            go(page, page.find_element(By.CSS_SELECTOR, "#dry-run button[type=submit]"))
            screenshot(page, "bulk-mistyped")
            assert text(page, "#mistake") == "Nothing done: type cancel in the box to confirm (it held 'cancle')."
            assert text(page, "#matched") == "3"  # the dry run, counted again over the same filters
            kept = {
                str(i.get_attribute("name")): str(i.get_attribute("value"))
                for i in page.find_elements(By.CSS_SELECTOR, "#dry-run input[name^='f.']")
            }
            assert kept == {"f.queue": "reports", "f.status": "queued"}
            assert page.find_element(By.NAME, "reason").get_attribute("value") == "reports are rebuilt tonight"
            assert page.find_element(By.NAME, "confirm").get_attribute("value") == ""
            page.find_element(By.NAME, "confirm").send_keys("cancel")
            go(page, page.find_element(By.CSS_SELECTOR, "#dry-run button[type=submit]"))
            assert "/console/operations/" in page.current_url
            WebDriverWait(page, 30, poll_frequency=0.2).until(lambda d: text(d, "#op-status") == "done")
            assert text(page, "#op-done") == "3"

        await in_browser(steps)
    rows = await pool.fetch("SELECT queue, status, count(*) AS n FROM tasks GROUP BY 1, 2 ORDER BY 1")
    assert [(r["queue"], r["status"], r["n"]) for r in rows] == [("other", "queued", 2), ("reports", "cancelled", 3)]
    reasons = await pool.fetch("SELECT reason FROM audit_events WHERE action = 'tasks.bulk'")
    assert [r["reason"] for r in reasons] == ["reports are rebuilt tonight"]


def _refreshes(page: Any) -> int:
    """How many times the page has fetched its operation so far."""
    count: int = page.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('/console/operations/')).length;"
    )
    return count


async def test_the_operation_page_follows_a_running_operation_batch_by_batch(
    start_instance: Any, stores: Any, pool: asyncpg.Pool, page: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        await make(client, admin, "exports", 1200)
        await pool.execute("UPDATE tasks SET status = 'failed' WHERE queue = 'exports'")
        base = f"http://127.0.0.1:{inst.port}"
        async with pool.acquire() as holder, holder.transaction():
            # The first task of the second batch (500) is held: the operation stops after its first batch
            # until this block ends, a running operation with a known part done.
            await holder.execute(  # (a FOR UPDATE beside the OFFSET would lock the rows it skips too)
                """SELECT id FROM tasks WHERE id = (SELECT id FROM tasks WHERE queue = 'exports'
                                                    ORDER BY created_at, id OFFSET 500 LIMIT 1) FOR UPDATE"""
            )

            def start_and_follow() -> None:
                sign_in(page, base, admin)
                page.get(f"{base}/console/tasks?queue=exports&status=failed")
                page.find_element(By.CSS_SELECTOR, "#bulk select[name=action] option[value=replay]").click()
                go(page, page.find_element(By.CSS_SELECTOR, "#bulk button[name=dry_run]"))
                page.find_element(By.NAME, "reason").send_keys("the exporter is fixed")
                go(page, page.find_element(By.CSS_SELECTOR, "#dry-run button[type=submit]"))
                WebDriverWait(page, 30, poll_frequency=0.1).until(lambda d: text(d, "#op-done") == "500")
                assert text(page, "#op-status") == "running"
                progress = page.find_element(By.ID, "op-progress")
                assert (progress.get_attribute("value"), progress.get_attribute("max")) == ("500", "1200")
                assert text(page, "#op-percent") == "41"
                screenshot(page, "bulk-running-part")
                seen = _refreshes(page)
                WebDriverWait(page, FOLLOW_WINDOW_SECONDS, poll_frequency=0.1).until(
                    lambda d: _refreshes(d) >= seen + FOLLOWED_FETCHES
                )

            await in_browser(start_and_follow)

        def to_the_end() -> None:
            WebDriverWait(page, 30, poll_frequency=0.2).until(lambda d: text(d, "#op-status") == "done")
            assert text(page, "#op-done") == "1,200"

        await in_browser(to_the_end)
