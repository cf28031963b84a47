"""What the console's pages say, read in a real browser: ids that tell tasks apart, charts that draw what
they scale to, axes with dates, fire times to the second, no age for an empty queue, and a favicon.

Headless Chromium against a real instance on real stores, as in ``test_console_browser.py``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from taskmesh.config import ScheduleSettings
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.tasks.registry import Registry
from tests.conftest import http
from tests.console.conftest import go, in_browser, screenshot
from tests.console.test_console_browser import bearer, sign_in, text, texts

pytestmark = pytest.mark.anyio


async def test_task_ids_in_lists_the_bulk_sample_titles_and_the_audit_log_show_the_part_that_differs(
    start_instance: Any, stores: Any, pool: asyncpg.Pool, page: Any
) -> None:
    from selenium.webdriver.common.by import By

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        made = await client.post(
            "/api/v1/tasks:batch",
            json={"tasks": [{"name": "report.build", "queue_name": "reports"} for _ in range(6)]},
            headers=bearer(admin),
        )
        assert made.status_code in (200, 201), made.text
        ids = [str(r["id"]) for r in await pool.fetch("SELECT id FROM tasks ORDER BY id")]
        for task_id in ids[:2]:  # two audit rows naming a task
            assert (await client.post(f"/api/v1/tasks/{task_id}/cancel", headers=bearer(admin))).status_code == 200
        base = f"http://127.0.0.1:{inst.port}"

        def shown(css: str) -> dict[str, str]:
            """Each task link's full id (its target) and the text it shows."""
            links = page.find_elements(By.CSS_SELECTOR, css)
            return {str(a.get_attribute("href")).rsplit("/", 1)[-1]: str(a.text) for a in links}

        def steps() -> None:
            sign_in(page, base, admin)
            page.get(f"{base}/console/tasks?queue=reports")
            listed = shown("#tasks td.id a")
            assert sorted(listed) == ids
            assert all(label == f"…{task_id[-12:]}" for task_id, label in listed.items()), listed
            assert len(set(listed.values())) == len(ids)  # made in the same millisecond, told apart
            screenshot(page, "legibility-ids")
            page.find_element(By.CSS_SELECTOR, "#bulk select[name=action] option[value=delete]").click()
            go(page, page.find_element(By.CSS_SELECTOR, "#bulk button[name=dry_run]"))
            sample = shown("#dry-run a.id")
            assert sample and all(label == f"…{task_id[-12:]}" for task_id, label in sample.items()), sample
            page.get(f"{base}/console/audit?action=task.cancel")
            audited = shown("#audit a.id")
            assert sorted(audited) == sorted(ids[:2])
            assert all(label == f"…{task_id[-12:]}" for task_id, label in audited.items()), audited
            page.get(f"{base}/console/tasks/{ids[0]}")
            assert page.title == f"Task …{ids[0][-12:]} · taskmesh"

        await in_browser(steps)


def _drawn_heights(page: Any, figure: int) -> list[float]:
    """The y of every point and dot drawn in the overview's ``figure``-th chart (0 is the chart's top)."""
    from selenium.webdriver.common.by import By

    chart = page.find_elements(By.CSS_SELECTOR, "#charts figure.chart")[figure]
    ys = [float(c.get_attribute("cy")) for c in chart.find_elements(By.CSS_SELECTOR, "circle")]
    for line in chart.find_elements(By.CSS_SELECTOR, "polyline"):
        ys += [float(p.split(",")[1]) for p in str(line.get_attribute("points")).split()]
    return ys


async def test_a_chart_draws_the_minute_still_going_and_the_day_views_axis_has_dates(
    start_instance: Any, stores: Any, pool: asyncpg.Pool, page: Any
) -> None:
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    # Ten runs a minute for the past hour; a hundred in the minute still going: the top of the scale.
    await pool.execute(
        """INSERT INTO queue_minutes (queue, minute, succeeded, failed, wait_counts)
           SELECT '*', date_trunc('minute', now()) - m * interval '1 minute', CASE WHEN m = 0 THEN 100 ELSE 10 END,
                  0, ARRAY[]::bigint[]
           FROM generate_series(0, 59) m"""
    )
    async with start_instance(workers_enabled=False) as inst:
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> str:
            sign_in(page, base, admin)
            page.get(f"{base}/console/overview")
            assert "top: 100 runs" in text(page, "#charts figure.chart .scale")
            heights = _drawn_heights(page, 0)
            screenshot(page, "legibility-chart-now")
            assert min(heights) < 3, sorted(heights)[:5]  # the hundred is drawn, at the top
            page.get(f"{base}/console/overview?window=day")
            return text(page, "#charts figure.chart .scale")

        scale = await in_browser(steps)
    now = datetime.now(UTC)
    firsts = [
        datetime.fromtimestamp((t.timestamp() // 300 - 287) * 300, UTC) for t in (now - timedelta(seconds=30), now)
    ]
    assert any(f"{first.day} {first:%b} {first:%H:%M}" in scale for first in firsts), scale
    assert f"{now.day} {now:%b}" in scale, scale


async def test_an_empty_queue_has_no_oldest_age_and_a_schedule_with_seconds_shows_its_fires_to_the_second(
    start_instance: Any, stores: Any, registry: Registry, page: Any
) -> None:
    @registry.task("report.build", queue="elsewhere")  # a queue no instance serves: the fires wait there
    async def build(payload: Any) -> None:
        return None

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    every10 = ScheduleSettings(name="every-10s", cron="*/10 * * * * *", task="report.build")
    nightly = ScheduleSettings(name="nightly", cron="30 2 * * *", timezone="Europe/Paris", task="report.build")
    async with start_instance(queue_names=["work"], schedules=[every10, nightly]) as inst:
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            sign_in(page, base, admin)
            page.get(f"{base}/console/queues")
            assert text(page, "tr[data-queue=work] td.oldest") == "–"
            page.get(f"{base}/console/overview")
            assert text(page, "#overview-queues tr[data-queue=work] td.oldest") == "–"
            page.get(f"{base}/console/schedules")
            fires = texts(page, "tr[data-schedule=every-10s] .fires > div")
            screenshot(page, "legibility-schedules")
            assert len(fires) == 3 and len(set(fires)) == 3, fires
            for fire in fires:
                assert re.fullmatch(r"\S+ (\d\d:\d\d:\d0) · \S+ \1 UTC", fire), fire
            for fire in texts(page, "tr[data-schedule=nightly] .fires > div"):  # no seconds in the spec: none shown
                assert re.fullmatch(r"\S+ 02:30 · \S+ 0[01]:30 UTC", fire), fire

        await in_browser(steps)


async def test_every_page_names_a_favicon_that_the_console_serves(start_instance: Any, stores: Any, page: Any) -> None:
    from selenium.webdriver.common.by import By

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(workers_enabled=False) as inst:
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> list[Any]:
            page.get(f"{base}/console/sign-in")
            seen = [page.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href")]
            sign_in(page, base, admin)
            seen.append(page.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href"))
            fetched = page.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "fetch(arguments[0])"
                ".then(r => r.text().then(t => done([r.status, r.headers.get('content-type'), t])));",
                seen[-1],
            )
            return [*seen, *fetched]

        first, signed_in, status, kind, body = await in_browser(steps)
    assert first == signed_in == f"{base}/console/static/favicon.svg"
    assert (status, kind) == (200, "image/svg+xml")
    assert body.startswith("<svg")


PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True}
"""A phone's viewport (an iPhone 12 to 15's CSS pixels)."""
ROW_MOST_PX = 80
"""The tallest a task's row may be on a phone: two lines and a margin (a wrapped table row was 150 px)."""


async def test_at_phone_width_the_lists_fit_the_screen_and_no_cell_breaks_a_word(
    start_instance: Any, stores: Any, page: Any
) -> None:
    from selenium.webdriver.common.by import By

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(queue_names=["work"]) as inst, http(inst) as client:
        for _ in range(5):
            body = {"name": "export.customers-to-warehouse", "queue_name": "long-queue-name-for-exports"}
            assert (await client.post("/api/v1/tasks", json=body, headers=bearer(admin))).status_code == 201
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            sign_in(page, base, admin)
            page.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
            try:
                for path in ("/console/tasks", "/console/overview", "/console/queues", "/console/audit"):
                    page.get(base + path)
                    wide = page.execute_script(
                        "return [document.documentElement.scrollWidth].concat(Array.from("
                        "document.querySelectorAll('main .card')).filter(c => c.scrollWidth > c.clientWidth + 1)"
                        ".map(c => c.id || c.querySelector('[id]').id));"
                    )
                    assert wide == [390], (path, wide)  # nothing scrolls sideways, the page or a card
                page.get(f"{base}/console/tasks")
                screenshot(page, "legibility-phone-tasks")
                rows = page.find_elements(By.CSS_SELECTOR, "#tasks tbody tr")
                assert len(rows) == 5 and all(r.size["height"] <= ROW_MOST_PX for r in rows), [r.size for r in rows]
                names = page.find_elements(By.CSS_SELECTOR, "#tasks td.name")
                line = page.execute_script("return parseFloat(getComputedStyle(arguments[0]).lineHeight);", names[0])
                assert all(n.size["height"] <= line + 1 for n in names), [n.size for n in names]  # one line each
            finally:
                page.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

        await in_browser(steps)
