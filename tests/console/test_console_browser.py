"""The console in a real browser: headless Chromium against a real instance on real stores.

Each test signs in with a key made as an operator makes one, clicks through the pages as a
person would, checks what the API then holds, and saves a screenshot of each page it visits
(``test-artefacts/console/``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import asyncpg
import httpx
import pytest

from taskmesh.config import ScheduleSettings
from taskmesh.errors import NonRetryableError
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.tasks.registry import Registry
from tests.conftest import http
from tests.console.conftest import go, in_browser, screenshot

T = TypeVar("T")

pytestmark = pytest.mark.anyio

HOSTILE = "<script>alert('x')</script>\"quoted\" & <b>bold</b>"
"""Text that would run or bend the page if the console did not escape it."""
HEALED: set[str] = set()
"""Payloads (``say``) that ``console.fail`` no longer fails: the fix shipped, a replay succeeds."""


def register(registry: Registry) -> None:
    @registry.task("console.ok")
    async def ok(payload: Any) -> Any:
        return {"echo": payload.get("say"), "html": HOSTILE}

    @registry.task("console.fail", queue="work", max_retries=0)
    async def fail(payload: Any) -> str:
        if payload.get("say") in HEALED:
            return "fixed"
        raise NonRetryableError(f"refused: {payload.get('say', '')}")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def enqueue(client: httpx.AsyncClient, key: str, name: str, **fields: Any) -> str:
    body = {"name": name, "queue_name": "work" if name.startswith("console.") else "default", **fields}
    made = await client.post("/api/v1/tasks", json=body, headers=bearer(key))
    assert made.status_code == 201, made.text
    task_id: str = made.json()["task_id"]
    return task_id


async def ended(client: httpx.AsyncClient, key: str, task_id: str) -> dict[str, Any]:
    got = await client.get(f"/api/v1/tasks/{task_id}?wait=8", headers=bearer(key))
    task: dict[str, Any] = got.json()["task"]
    assert task["status"] in ("completed", "failed", "cancelled"), task
    return task


def sign_in(driver: Any, base: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/console/sign-in")
    driver.find_element(By.ID, "key").send_keys(key)
    go(driver, driver.find_element(By.CSS_SELECTOR, "form button[type=submit]"))


STALE_READS = 5
"""Reads of a live page before a replaced element counts as a failure."""


def _fresh(read: Callable[[], T]) -> T:
    """``read()``, again when a live refresh replaced an element between its find and its read."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(STALE_READS - 1):
        try:
            return read()
        except StaleElementReferenceException:
            continue
    return read()


def text(driver: Any, css: str) -> str:
    """The text of the first element matching ``css`` (see :func:`_fresh`)."""
    from selenium.webdriver.common.by import By

    return _fresh(lambda: str(driver.find_element(By.CSS_SELECTOR, css).text))


def texts(driver: Any, css: str) -> list[str]:
    """The texts of every element matching ``css`` (see :func:`_fresh`)."""
    from selenium.webdriver.common.by import By

    return _fresh(lambda: [str(e.text) for e in driver.find_elements(By.CSS_SELECTOR, css)])


def no_alert(driver: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        alert = driver.switch_to.alert
    except NoAlertPresentException:
        return
    raise AssertionError(f"a script of the data ran: alert {alert.text!r}")


async def test_sign_in_search_open_a_task_see_every_page_and_sign_out(
    start_instance: Any, stores: Any, registry: Registry, pool: asyncpg.Pool, page: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    register(registry)
    admin = (await api_keys.create(stores.pg, "ops-admin", list(SCOPES))).key
    nightly = ScheduleSettings(name="nightly-export", cron="30 2 * * 1-5", timezone="Europe/Paris", task="console.ok")
    settings = {"queue_names": ["work"], "metrics_sample_seconds": 0.2, "schedules": [nightly]}
    async with start_instance(**settings) as inst, http(inst) as client:
        done = await enqueue(client, admin, "console.ok", payload={"say": "hello", "n": 7})
        await ended(client, admin, done)
        for n in range(3):
            await enqueue(client, admin, "report.build", payload={"customer": {"id": n}})
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            page.get(f"{base}/console/tasks")
            assert "/console/sign-in" in page.current_url  # not signed in: sent to sign in, then back
            screenshot(page, "01-sign-in")
            sign_in(page, base, admin[:-4] + ("0000" if not admin.endswith("0000") else "1111"))
            assert text(page, ".refused") == f"Not signed in: no valid key has id {admin[4:20]}"
            sign_in(page, base, admin)
            assert page.current_url.startswith(f"{base}/console")
            assert text(page, ".who .key") == "ops-admin"
            page.get(f"{base}/console/overview")
            assert "work" in text(page, "#overview-queues")
            assert "top: 1 run" in text(page, "#charts")  # the run, through the sampler's rollup
            assert len(page.find_elements(By.CSS_SELECTOR, "#charts svg")) == 4
            page.get(f"{base}/console/overview?queue=work&window=day")
            assert text(page, "#charts h2") == "Last day, queue work"
            screenshot(page, "02-overview")
            page.get(f"{base}/console/tasks")
            page.find_element(By.ID, "f-payload").send_keys("customer.id=1")
            go(page, page.find_element(By.CSS_SELECTOR, "#search button[type=submit]"))
            assert "payload.customer.id=1" in page.current_url  # the filters are in the URL: a bookmark
            assert len(texts(page, "#tasks tbody tr")) == 1
            page.get(f"{base}/console/tasks?name=console.ok")
            screenshot(page, "03-tasks")
            go(page, page.find_element(By.CSS_SELECTOR, "#tasks tbody a"))
            assert done in page.current_url
            assert "payload" not in page.page_source.split('id="task-data"')[0]  # not in the page itself
            page.find_element(By.CSS_SELECTOR, "#task-data summary").click()
            WebDriverWait(page, 10).until(ec.presence_of_element_located((By.ID, "payload")))
            assert '"say": "hello"' in text(page, "#payload")
            assert HOSTILE.replace('"', '\\"') in text(page, "#result")
            assert "Attempt 1" in text(page, "#runs")
            screenshot(page, "04-task")
            for name in ("queues", "dlq", "workers", "schedules", "audit"):
                page.get(f"{base}/console/{name}")
                assert page.title.endswith("taskmesh"), name
                assert not page.find_elements(By.CSS_SELECTOR, ".refused"), (name, page.page_source[:2000])
                screenshot(page, f"05-{name}")
            assert "console.sign_in" in text(page, "#audit")
            page.get(f"{base}/console/schedules")
            row = text(page, "tr[data-schedule=nightly-export]")
            assert "At 02:30, Monday through Friday" in row and "Europe/Paris" in row, row
            go(
                page,
                page.find_element(By.CSS_SELECTOR, "tr[data-schedule=nightly-export] form[action$=trigger] button"),
            )
            assert text(page, ".flash.ok").startswith("nightly-export fired now: task ")
            go(page, page.find_element(By.CSS_SELECTOR, ".who button"))
            assert "/console/sign-in" in page.current_url
            page.get(f"{base}/console/tasks")
            assert "/console/sign-in" in page.current_url  # the session is over

        await in_browser(steps)
    assert await pool.fetchval("SELECT count(*) FROM console_sessions") == 0  # signed out: deleted


async def test_replay_from_the_dead_letter_queue_with_a_new_priority_and_pause_a_queue(
    start_instance: Any, stores: Any, registry: Registry, page: Any
) -> None:
    from selenium.webdriver.common.by import By

    register(registry)
    operator = (await api_keys.create(stores.pg, "oncall", list(api_keys.ROLES["operator"]))).key
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(queue_names=["work"]) as inst, http(inst) as client:
        failed = [await enqueue(client, admin, "console.fail", payload={"say": f"no {n}"}) for n in range(3)]
        for task_id in failed:
            await ended(client, admin, task_id)
        base = f"http://127.0.0.1:{inst.port}"
        HEALED.add("no 0")

        def dlq_steps() -> None:
            sign_in(page, base, operator)
            page.get(f"{base}/console/dlq")
            go(page, page.find_element(By.LINK_TEXT, "work"))
            assert len(texts(page, "#dlq tbody tr")) == 3
            assert "refused: no 0" in text(page, "#dlq")
            screenshot(page, "06-dlq")
            page.find_element(By.CSS_SELECTOR, f"input[value='{failed[0]}']").click()
            page.find_element(By.NAME, "priority").send_keys("7")
            go(page, page.find_element(By.CSS_SELECTOR, "button[value=replay]"))
            assert text(page, ".flash.ok") == "Replayed 1 task."
            assert len(texts(page, "#dlq tbody tr")) == 2

        await in_browser(dlq_steps)
        audit = await client.get("/api/v1/audit?action=dlq.replay", headers=bearer(admin))
        event = audit.json()["events"][0]
        assert (event["actor"]["name"], event["outcome"]) == ("oncall", "ok")
        task = await ended(client, admin, failed[0])
        assert (task["status"], task["priority"], task["attempts"]) == ("completed", 7, 2)

        def pause_steps() -> None:
            page.get(f"{base}/console/queues")
            row = page.find_element(By.CSS_SELECTOR, "tr[data-queue=work]")
            row.find_element(By.NAME, "reason").send_keys("provider outage")
            go(page, row.find_element(By.CSS_SELECTOR, "button[type=submit]"))
            assert "Queue work paused" in text(page, ".flash.ok")
            assert "paused" in text(page, "tr[data-queue=work]")
            assert "provider outage" in text(page, "tr[data-queue=work]")
            screenshot(page, "07-queues-paused")

        await in_browser(pause_steps)
        state = (await client.get("/api/v1/queues/work", headers=bearer(admin))).json()
        assert (state["paused"], state["reason"]) == (True, "provider outage")


async def test_a_bulk_dry_run_counts_and_a_bulk_replay_shows_its_progress_to_the_end(
    start_instance: Any, stores: Any, registry: Registry, pool: asyncpg.Pool, page: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    register(registry)
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        for _ in range(2):  # more than two of the operation's batches (500), for a bar that moves
            made = await client.post(
                "/api/v1/tasks:batch",
                json={"tasks": [{"name": "export.csv", "queue_name": "exports"} for _ in range(600)]},
                headers=bearer(admin),
            )
            assert made.status_code in (200, 201), made.text
        await pool.execute("UPDATE tasks SET status = 'failed' WHERE queue = 'exports'")
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            sign_in(page, base, admin)
            page.get(f"{base}/console/tasks?status=failed&queue=exports&order=asc")  # the order is no filter
            page.find_element(By.CSS_SELECTOR, "#bulk select[name=action] option[value=replay]").click()
            go(page, page.find_element(By.CSS_SELECTOR, "#bulk button[name=dry_run]"))
            assert text(page, "#matched") == "1,200"
            screenshot(page, "08-bulk-dry-run")
            page.find_element(By.NAME, "reason").send_keys("the exporter is fixed")
            go(page, page.find_element(By.CSS_SELECTOR, "#dry-run button[type=submit]"))
            assert "/console/operations/" in page.current_url
            screenshot(page, "09-bulk-running")
            # The page follows the operation by itself (no reload) until it ends.
            WebDriverWait(page, 60, poll_frequency=0.5).until(lambda d: text(d, "#op-status") == "done")
            assert text(page, "#op-done") == "1,200"
            screenshot(page, "10-bulk-done")

        await in_browser(steps)
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'queued' AND queue = 'exports'") == 1200
    reasons = await pool.fetch("SELECT reason FROM audit_events WHERE action = 'tasks.bulk'")
    assert [r["reason"] for r in reasons] == ["the exporter is fixed"]


async def test_a_viewer_sees_no_action_and_is_refused_with_403_when_it_posts_anyway(
    start_instance: Any, stores: Any, registry: Registry, pool: asyncpg.Pool, page: Any
) -> None:
    from selenium.webdriver.common.by import By

    register(registry)
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    viewer = (await api_keys.create(stores.pg, "looker", list(api_keys.ROLES["viewer"]))).key
    async with start_instance(queue_names=["work"]) as inst, http(inst) as client:
        task_id = await enqueue(client, admin, "console.fail", payload={"say": "x"})
        await ended(client, admin, task_id)
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> int:
            sign_in(page, base, viewer)
            for path in (f"/console/tasks/{task_id}", "/console/queues", "/console/dlq/work", "/console/schedules"):
                page.get(base + path)
                buttons = [b.text for b in page.find_elements(By.CSS_SELECTOR, "main button")]
                assert buttons == [], (path, buttons)
            screenshot(page, "11-viewer-schedules")
            page.get(f"{base}/console/tasks/{task_id}")
            screenshot(page, "12-viewer-task")
            csrf = page.find_element(By.CSS_SELECTOR, ".who input[name=csrf_token]").get_attribute("value")
            status: int = page.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "fetch(arguments[0], {method: 'POST', body: new URLSearchParams({csrf_token: arguments[1]})})"
                ".then(r => done(r.status));",
                "/console/queues/work/pause",
                csrf,
            )
            return status

        assert await in_browser(steps) == 403
        state = (await client.get("/api/v1/queues/work", headers=bearer(admin))).json()
        assert state["paused"] is False
    denied = await pool.fetch("SELECT actor_name, outcome FROM audit_events WHERE action = 'queue.pause'")
    assert [(r["actor_name"], r["outcome"]) for r in denied] == [("looker", "denied")]


async def test_a_tenant_key_sees_only_its_tenant(
    start_instance: Any, stores: Any, registry: Registry, page: Any
) -> None:
    from selenium.webdriver.common.by import By

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    acme = (await api_keys.create(stores.pg, "acme-ops", list(api_keys.ROLES["operator"]), tenant_id="acme")).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        ours = [await enqueue(client, admin, "report.build", tenant_id="acme") for _ in range(2)]
        theirs = await enqueue(client, admin, "report.build", tenant_id="globex")
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            sign_in(page, base, acme)
            assert "tenant acme" in text(page, ".who")
            assert page.current_url == f"{base}/console/tasks"  # the overview counts every tenant
            # an operator: no audit:read
            assert texts(page, ".top nav a") == ["Limits", "Tasks", "Workflows", "Dead letters", "Schedules"]
            page.get(f"{base}/console/tasks")
            links = [
                a.get_attribute("href").rsplit("/", 1)[-1] for a in page.find_elements(By.CSS_SELECTOR, "#tasks a")
            ]
            assert sorted(links) == sorted(ours)
            screenshot(page, "13-tenant-tasks")
            page.get(f"{base}/console/tasks?tenant_id=globex")
            assert page.find_elements(By.CSS_SELECTOR, "#tasks") == []
            page.get(f"{base}/console/tasks/{theirs}")
            assert "not found" in text(page, ".refused").lower()
            page.get(f"{base}/console/queues")
            assert "Forbidden" in text(page, ".refused")  # counts of every tenant: not for a tenant key
            screenshot(page, "14-tenant-queues")

        await in_browser(steps)


async def test_markup_in_errors_payloads_results_reasons_and_names_is_shown_as_text(
    start_instance: Any, stores: Any, registry: Registry, pool: asyncpg.Pool, page: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    register(registry)
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(queue_names=["work"]) as inst, http(inst) as client:
        bad = await enqueue(client, admin, "console.fail", payload={"say": HOSTILE}, dedup_key=HOSTILE)
        good = await enqueue(client, admin, "console.ok", payload={"say": HOSTILE})
        for task_id in (bad, good):
            await ended(client, admin, task_id)
        refused = await client.post("/api/v1/tasks", json={"name": "<script>"}, headers=bearer(admin))
        assert refused.status_code == 422  # names cannot hold markup; a row written by other means:
        await pool.execute("UPDATE tasks SET name = $1 WHERE id = $2", HOSTILE, uuid.UUID(good))
        paused = await client.post("/api/v1/queues/work/pause", json={"reason": HOSTILE}, headers=bearer(admin))
        assert paused.status_code == 200
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            sign_in(page, base, admin)
            page.get(f"{base}/console/tasks")
            assert HOSTILE in text(page, "#tasks")  # the name and the error, as text
            screenshot(page, "15-escaped-tasks")
            page.get(f"{base}/console/tasks/{bad}")
            assert f"refused: {HOSTILE}" in text(page, "#runs")
            page.find_element(By.CSS_SELECTOR, "#task-data summary").click()
            WebDriverWait(page, 10).until(ec.presence_of_element_located((By.ID, "payload")))
            assert HOSTILE.replace('"', '\\"') in text(page, "#payload")
            page.get(f"{base}/console/tasks/{good}")
            assert HOSTILE in text(page, "h1")
            page.find_element(By.CSS_SELECTOR, "#task-data summary").click()
            WebDriverWait(page, 10).until(ec.presence_of_element_located((By.ID, "result")))
            assert HOSTILE.replace('"', '\\"') in text(page, "#result")
            screenshot(page, "16-escaped-task")
            page.get(f"{base}/console/dlq/work")
            assert f"refused: {HOSTILE}" in text(page, "#dlq")
            page.get(f"{base}/console/queues")
            assert HOSTILE in text(page, "tr[data-queue=work]")
            page.get(f"{base}/console/audit?action=queue.pause")
            assert HOSTILE in text(page, "#audit")
            for css in ("script:not([src])", "b"):
                assert page.find_elements(By.CSS_SELECTOR, f"main {css}") == [], css
            no_alert(page)

        await in_browser(steps)


async def test_selected_tasks_are_cancelled_and_the_queues_page_follows_new_tasks_without_a_reload(
    start_instance: Any, stores: Any, page: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        made = [await enqueue(client, admin, "report.build", payload={"n": n}) for n in range(3)]
        base = f"http://127.0.0.1:{inst.port}"

        def select_and_cancel() -> None:
            sign_in(page, base, admin)
            page.get(f"{base}/console/tasks?name=report.build")
            for task_id in made[:2]:
                page.find_element(By.CSS_SELECTOR, f"#tasks input[value='{task_id}']").click()
            go(page, page.find_element(By.CSS_SELECTOR, "#selection button[value=cancel]"))
            assert text(page, ".flash.ok") == "Cancelled: 2 of 2 selected."
            assert "name=report.build" in page.current_url  # back on the same search
            page.get(f"{base}/console/queues")
            page.execute_script("window.notReloaded = true;")
            assert text(page, "tr[data-queue=default] td:nth-child(3)") == "1"

        await in_browser(select_and_cancel)
        for n in range(4):
            await enqueue(client, admin, "report.build", payload={"more": n})

        def follows() -> None:
            WebDriverWait(page, 15, poll_frequency=0.5).until(
                lambda d: text(d, "tr[data-queue=default] td:nth-child(3)") == "5"
            )
            assert page.execute_script("return window.notReloaded === true;")  # updated in place
            screenshot(page, "17-queues-live")

        await in_browser(follows)
        statuses = [
            (await client.get(f"/api/v1/tasks/{t}", headers=bearer(admin))).json()["task"]["status"] for t in made
        ]
    assert statuses == ["cancelled", "cancelled", "queued"]
