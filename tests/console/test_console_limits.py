"""Task limits in the console, in a real browser: the Limits page with live usage while tasks run, its form
setting and dropping a limit at run time, no form for a key that may not change one, and a waiting
task's page saying why it waits (its ``blocked_by``).

Headless Chromium against a real instance on real stores, as in ``test_console_browser.py``; each page
visited is saved as a screenshot (``test-artefacts/console/limits-*.png``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

import taskmesh
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for
from tests.console.conftest import go, in_browser, screenshot
from tests.console.test_console_browser import bearer, sign_in, text, texts

pytestmark = pytest.mark.anyio

API = {"api": {"task": "lim.hold", "concurrency": 2}}
"""One limit of two runs at once for ``lim.hold``, as ``[limits.api]`` declares it."""


@pytest.fixture
def gate() -> Iterator[dict[str, bool]]:
    """Holds ``lim.hold`` and ``lim.keyed`` running while ``hold`` is true."""
    yield {"hold": True}


def register(registry: Registry, gate: dict[str, bool]) -> None:
    async def held() -> None:
        while gate["hold"]:
            await anyio.sleep(0.05)

    @registry.task("lim.hold")
    async def hold(payload: Any) -> None:
        await held()

    @registry.task("lim.keyed")
    async def keyed(payload: Any) -> None:
        await held()


async def create(client: httpx.AsyncClient, key: str, bodies: list[dict[str, Any]]) -> list[str]:
    made = await client.post("/api/v1/tasks:batch", json={"tasks": bodies}, headers=bearer(key))
    assert made.status_code in (200, 201), made.text
    return [t["task_id"] for t in made.json()["results"]]


async def usage_of(client: httpx.AsyncClient, key: str, limit: str) -> list[tuple[str, int, int]]:
    """``[(limit key, in use, waiting)]`` of ``limit`` as the API counts them now."""
    got = await client.get(f"/api/v1/limits/{limit}", headers=bearer(key))
    assert got.status_code == 200, got.text
    return [(u["key"], u["in_use"], u["waiting"]) for u in got.json()["usage"]]


async def test_the_limits_page_lists_a_configured_limit_with_its_usage_and_follows_it_while_tasks_run(
    start_instance: Any, stores: Any, registry: Registry, pool: asyncpg.Pool, page: Any, gate: dict[str, bool]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    register(registry, gate)
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    limits = {**API, "per_customer": {"task": "lim.keyed", "key": "payload.customer", "concurrency": 1}}
    async with start_instance(worker_concurrency=8, limits=limits) as inst, http(inst) as client:
        ids = await create(client, admin, [{"name": "lim.hold"} for _ in range(5)])
        ids += await create(client, admin, [{"name": "lim.keyed", "payload": {"customer": "acme"}} for _ in range(2)])

        async def held() -> bool:
            api = await usage_of(client, admin, "api")
            keyed = await usage_of(client, admin, "per_customer")
            return api == [("api", 2, 3)] and keyed == [("per_customer:acme", 1, 1)]

        await wait_for(held, timeout=15, interval=0.1)
        base = f"http://127.0.0.1:{inst.port}"

        def while_held() -> None:
            sign_in(page, base, admin)
            page.get(f"{base}/console/queues")
            go(page, page.find_element(By.LINK_TEXT, "Limits"))  # beside Queues in the header
            assert texts(page, ".top nav a")[:3] == ["Overview", "Queues", "Limits"]
            assert texts(page, "#limits tbody td.name") == ["api", "per_customer"]
            assert text(page, "tr[data-limit=api] .applies") == "task lim.hold, any queue, one counter"
            assert text(page, "tr[data-limit=api] .concurrency") == "2"
            assert text(page, "tr[data-limit=api] .source") == "config"
            keyed = "tr[data-limit=per_customer] .applies"
            assert text(page, keyed) == "task lim.keyed, any queue, one counter per payload.customer"
            row = "#usage tr[data-limit=api][data-queue=default]"
            assert (text(page, f"{row} .in-use"), text(page, f"{row} .waiting")) == ("2 / 2 full", "3")
            row = "#usage tr[data-limit=per_customer]"
            assert (text(page, f"{row} .key"), text(page, f"{row} .in-use")) == ("acme", "1 / 1 full")
            assert text(page, f"{row} .waiting") == "1"
            screenshot(page, "limits-page")
            page.execute_script("window.notReloaded = true;")

        await in_browser(while_held)
        gate["hold"] = False

        def after() -> None:
            # The page follows the limits by itself (no reload): every run ended, nothing waits.
            WebDriverWait(page, 20, poll_frequency=0.5).until(lambda d: d.find_elements(By.ID, "usage-none"))
            assert page.execute_script("return window.notReloaded === true;")
            assert text(page, "#usage-none") == "No run holds a limit and no task waits for one."
            screenshot(page, "limits-page-idle")

        await in_browser(after)
        done = await pool.fetchval(
            "SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[]) AND status = 'completed'", ids
        )
        assert done == len(ids)


async def test_the_form_sets_a_limit_at_run_time_and_drops_it_again_as_the_api_then_answers(
    start_instance: Any, stores: Any, registry: Registry, pool: asyncpg.Pool, page: Any, gate: dict[str, bool]
) -> None:
    from selenium.webdriver.common.by import By

    register(registry, gate)
    made = await api_keys.create(stores.pg, "oncall", list(api_keys.ROLES["operator"]))
    operator, operator_id = made.key, made.record["key_id"]
    async with start_instance(workers_enabled=False, limits=API) as inst, http(inst) as client:
        base = f"http://127.0.0.1:{inst.port}"

        def fill(limit: str, **fields: str) -> None:
            for name, value in fields.items():
                box = page.find_element(By.CSS_SELECTOR, f".limit-form[data-limit={limit}] input[name={name}]")
                box.clear()
                box.send_keys(value)

        def set_steps() -> None:
            sign_in(page, base, operator)
            page.get(f"{base}/console/limits")
            fill("api", concurrency="lots")
            go(page, page.find_element(By.CSS_SELECTOR, ".limit-form[data-limit=api] button[type=submit]"))
            assert text(page, ".flash.bad") == "Limit api not set: concurrency must be a whole number, not 'lots'."
            fill("api", concurrency="5", rate="30/m", burst="3")
            go(page, page.find_element(By.CSS_SELECTOR, ".limit-form[data-limit=api] button[type=submit]"))
            assert text(page, ".flash.ok") == (
                "Limit api set at run time: concurrency 5, rate 30/m, burst 3. Every instance holds it within a second."
            )
            assert text(page, "tr[data-limit=api] .concurrency") == "5"
            assert text(page, "tr[data-limit=api] .rate") == "30/m, burst 3"
            assert text(page, "tr[data-limit=api] .source").startswith(f"set at run time by key {operator_id}, 20")
            screenshot(page, "limits-set")

        await in_browser(set_steps)
        listed = (await client.get("/api/v1/limits", headers=bearer(operator))).json()["limits"]
        assert [(x["name"], x["task"], x["concurrency"], x["rate"], x["burst"], x["source"]) for x in listed] == [
            ("api", "lim.hold", 5, "30/m", 3, "api")  # whom it holds kept: only the numbers changed
        ]
        assert listed[0]["updated_by"] == operator_id

        def drop_steps() -> None:
            page.find_element(By.CSS_SELECTOR, ".limit-form[data-limit=api] details summary").click()
            page.find_element(By.CSS_SELECTOR, ".limit-form[data-limit=api] input[name=confirm]").send_keys("yes")
            go(page, page.find_element(By.CSS_SELECTOR, ".limit-form[data-limit=api] button.danger"))
            assert text(page, ".flash.bad") == "Limit api not dropped: type drop in the box to confirm."
            page.find_element(By.CSS_SELECTOR, ".limit-form[data-limit=api] details summary").click()
            page.find_element(By.CSS_SELECTOR, ".limit-form[data-limit=api] input[name=confirm]").send_keys("drop")
            go(page, page.find_element(By.CSS_SELECTOR, ".limit-form[data-limit=api] button.danger"))
            assert text(page, ".flash.ok") == "Limit api: the configured one holds again (concurrency 2)."
            assert text(page, "tr[data-limit=api] .source") == "config"
            assert page.find_elements(By.CSS_SELECTOR, ".limit-form[data-limit=api] details") == []  # nothing to drop

        await in_browser(drop_steps)
        again = (await client.get("/api/v1/limits/api", headers=bearer(operator))).json()
        assert (again["concurrency"], again["rate"], again["source"]) == (2, None, "config")
    audited = await pool.fetch(
        "SELECT action, actor_name, outcome FROM audit_events WHERE resource_type = 'limit' ORDER BY id"
    )
    assert [tuple(r) for r in audited] == [("limit.set", "oncall", "ok"), ("limit.unset", "oncall", "ok")]


async def test_a_viewer_sees_the_limits_without_a_form_and_a_tenant_key_only_its_tenants_counter(
    start_instance: Any, stores: Any, registry: Registry, page: Any, gate: dict[str, bool]
) -> None:
    from selenium.webdriver.common.by import By

    register(registry, gate)
    viewer = (await api_keys.create(stores.pg, "looker", list(api_keys.ROLES["viewer"]))).key
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    acme = (await api_keys.create(stores.pg, "acme-ops", list(api_keys.ROLES["operator"]), tenant_id="acme")).key
    limits = {**API, "per_tenant": {"task": "lim.keyed", "key": "tenant_id", "concurrency": 1}}
    async with start_instance(worker_concurrency=8, limits=limits) as inst, http(inst) as client:
        for tenant in ("acme", "acme", "globex", "globex"):
            await create(client, admin, [{"name": "lim.keyed", "tenant_id": tenant}])
        both = {("per_tenant:acme", 1, 1), ("per_tenant:globex", 1, 1)}  # a run and a waiting task each
        await wait_for(lambda: _counted(client, admin, both), timeout=15, interval=0.1)
        base = f"http://127.0.0.1:{inst.port}"

        def viewer_steps() -> int:
            sign_in(page, base, viewer)
            page.get(f"{base}/console/limits")
            assert texts(page, "#limits tbody td.name") == ["api", "per_tenant"]
            assert page.find_elements(By.ID, "change-limits") == []
            assert page.find_elements(By.CSS_SELECTOR, "main form, main button") == []
            screenshot(page, "limits-viewer")
            csrf = page.find_element(By.CSS_SELECTOR, ".who input[name=csrf_token]").get_attribute("value")
            status: int = page.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "fetch(arguments[0], {method: 'POST', body: new URLSearchParams({csrf_token: arguments[1], "
                "concurrency: '50'})}).then(r => done(r.status));",
                "/console/limits/api/set",
                csrf,
            )
            return status

        assert await in_browser(viewer_steps) == 403  # posted anyway: the API's refusal
        assert (await client.get("/api/v1/limits/api", headers=bearer(admin))).json()["concurrency"] == 2

        def tenant_steps() -> None:
            page.get("about:blank")
            page.delete_all_cookies()
            sign_in(page, base, acme)
            assert "Limits" in texts(page, ".top nav a")
            page.get(f"{base}/console/limits")
            assert texts(page, "#limits tbody td.name") == ["per_tenant"]  # counted per tenant: its own
            assert texts(page, "#usage tbody td.key") == ["acme"]
            assert text(page, "#usage tr[data-key='per_tenant:acme'] .in-use") == "1 / 1 full"
            assert page.find_elements(By.ID, "change-limits") == []  # its numbers hold for every tenant
            screenshot(page, "limits-tenant")

        await in_browser(tenant_steps)
        gate["hold"] = False


async def _counted(client: httpx.AsyncClient, key: str, wanted: set[tuple[str, int, int]]) -> bool:
    return set(await usage_of(client, key, "per_tenant")) == wanted


async def test_the_task_page_says_why_a_task_waits(
    start_instance: Any, stores: Any, registry: Registry, pool: asyncpg.Pool, page: Any, gate: dict[str, bool]
) -> None:
    from selenium.webdriver.common.by import By

    register(registry, gate)

    @registry.task("lim.limited")
    async def limited(payload: Any) -> None:
        raise taskmesh.RateLimited(retry_after=600)  # the provider said 429: its key waits

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    limits = {**API, "provider": {"task": "lim.limited", "rate": "100/s"}}
    async with start_instance(worker_concurrency=8, limits=limits) as inst, http(inst) as client:
        held = await create(client, admin, [{"name": "lim.hold"} for _ in range(3)])
        await wait_for(lambda: _api_full(client, admin), timeout=15, interval=0.1)
        await create(client, admin, [{"name": "lim.limited"}])  # told to wait: it waits out its own delay
        await wait_for(lambda: _provider_backing_off(client, admin), timeout=15, interval=0.1)
        [backing_off] = await create(client, admin, [{"name": "lim.limited"}])  # parked: its key backs off
        await wait_for(lambda: _backing_off(client, admin, backing_off), timeout=15, interval=0.1)
        [provider] = (await client.get("/api/v1/limits/provider", headers=bearer(admin))).json()["usage"]
        until = datetime.fromtimestamp(provider["backing_off_until_ms"] / 1000, UTC).isoformat()[:19].replace("T", " ")
        tasks = {t: (await client.get(f"/api/v1/tasks/{t}", headers=bearer(admin))).json()["task"] for t in held}
        [parked] = [t for t, task in tasks.items() if task["blocked_by"]]
        running = next(t for t in held if t != parked)
        [ready, delayed] = await create(
            client,
            admin,
            [
                {"name": "report.build", "queue_name": "idle"},  # no instance serves idle
                {"name": "report.build", "queue_name": "idle", "delay_seconds": 3600},
            ],
        )
        paused_queue = await client.post("/api/v1/queues/held/pause", headers=bearer(admin))
        assert paused_queue.status_code == 200, paused_queue.text
        [paused] = await create(client, admin, [{"name": "report.build", "queue_name": "held"}])
        flow = {
            "name": "two-steps",
            "queue_name": "idle",
            "nodes": [{"id": "a", "task": "report.build"}, {"id": "b", "task": "report.build", "deps": ["a"]}],
        }
        made = await client.post("/api/v1/workflows", json=flow, headers=bearer(admin))
        assert made.status_code == 201, made.text
        blocked = str(await pool.fetchval("SELECT id FROM tasks WHERE status = 'blocked'"))
        run_at = (await client.get(f"/api/v1/tasks/{delayed}", headers=bearer(admin))).json()["task"]["run_at"]
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            sign_in(page, base, admin)
            said = {}
            for task_id in (parked, backing_off, ready, delayed, paused, blocked):
                page.get(f"{base}/console/tasks/{task_id}")
                said[task_id] = text(page, "#blocked-by")
                if task_id in (parked, backing_off):
                    screenshot(page, "limits-task-waiting" if task_id == parked else "limits-task-backing-off")
            assert said[parked] == "Waiting for limit api (2/2 running) · Limits page"
            assert said[backing_off] == (
                f"Waiting for limit provider: backing off until {until} (a handler asked it to wait) · Limits page"
            )
            assert said[ready] == "Ready: waiting for a free worker"
            assert said[delayed] == f"Delayed until {run_at[:19].replace('T', ' ')}"
            assert said[paused] == "Queue paused: no instance claims its tasks until it is resumed"
            assert said[blocked] == "Waiting for its workflow's deps · workflow page"
            go(page, page.find_element(By.CSS_SELECTOR, "#blocked-by a"))
            assert "/console/workflows/" in page.current_url
            page.get(f"{base}/console/tasks/{running}")
            assert page.find_elements(By.ID, "blocked-by") == []  # running: not waiting
            page.get(f"{base}/console/limits")
            row = "#usage tr[data-limit=provider]"
            assert (text(page, f"{row} .in-use"), text(page, f"{row} .until")) == ("0", until)
            screenshot(page, "limits-backing-off")

        await in_browser(steps)
        gate["hold"] = False


async def test_the_task_page_says_a_task_waits_its_tenants_turn_in_a_queue_with_fair_shares(
    start_instance: Any, stores: Any, registry: Registry, pool: asyncpg.Pool, page: Any, gate: dict[str, bool]
) -> None:
    register(registry, gate)
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    queues = {"default": {"concurrency": 1, "fairness": {"key": "tenant_id"}}}
    async with start_instance(queues=queues) as inst, http(inst) as client:
        [running] = await create(client, admin, [{"name": "lim.hold", "tenant_id": "acme"}])
        await wait_for(lambda: _running(pool, running), timeout=15, interval=0.1)
        waiting = await create(client, admin, [{"name": "lim.hold", "tenant_id": "acme"} for _ in range(3)])
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> list[str]:
            sign_in(page, base, admin)
            said = []
            for task_id in waiting:
                page.get(f"{base}/console/tasks/{task_id}")
                said.append(text(page, "#blocked-by"))
                if said[-1].startswith("Waiting its turn"):
                    screenshot(page, "limits-task-fair-share")
            return said

        said = await in_browser(steps)
        gate["hold"] = False
    turn = "Waiting its turn: fair shares, key acme (keys with fewer running go first)"
    # one fetch's worth waits in the ready set for the executor to free, the others their tenant's turn
    assert sorted(said) == ["Ready: waiting for a free worker", turn, turn]


async def _running(pool: asyncpg.Pool, task_id: str) -> bool:
    return bool(await pool.fetchval("SELECT status = 'running' FROM tasks WHERE id = $1", task_id))


async def _api_full(client: httpx.AsyncClient, key: str) -> bool:
    return await usage_of(client, key, "api") == [("api", 2, 1)]


async def _provider_backing_off(client: httpx.AsyncClient, key: str) -> bool:
    got = await client.get("/api/v1/limits/provider", headers=bearer(key))
    return any(u["backing_off_until_ms"] for u in got.json()["usage"])


async def _backing_off(client: httpx.AsyncClient, key: str, task_id: str) -> bool:
    task = (await client.get(f"/api/v1/tasks/{task_id}", headers=bearer(key))).json()["task"]
    return any(r.get("holds") == "back_off" for r in task["blocked_by"] or [])
