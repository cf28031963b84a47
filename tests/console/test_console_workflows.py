"""The console's workflow pages in a real browser: the list, the graph coloured by state with a map node
counted, a click on a node landing on its task, cancel and retry, and the API's refusals shown.

Headless Chromium against a real instance on real stores, as in ``test_console_browser.py``; the
screenshots of the list and of the graphs go to ``test-artefacts/console/wf-*.png``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from taskmesh.errors import NonRetryableError
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.tasks.models import TaskContext
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for
from tests.console.conftest import ARTEFACTS, go, in_browser, screenshot
from tests.console.test_console_browser import bearer, sign_in, text, texts

pytestmark = pytest.mark.anyio

ITEMS = 12
"""Items of each test workflow's map."""
BAD_ITEM = 7
"""The item the failing workflow's map fails on."""
FILLS = {
    "succeeded": "rgb(232, 245, 238)",
    "running": "rgb(255, 244, 224)",
    "failed": "rgb(253, 236, 234)",
    "cancelled": "rgb(238, 240, 244)",
    "skipped": "rgb(243, 241, 247)",
    "blocked": "rgb(255, 255, 255)",
}
"""The fill of a node's box in each state (``console.css``: the task statuses' colours)."""


@pytest.fixture(autouse=True)
async def no_workflows(pool: asyncpg.Pool) -> None:
    """No workflow of an earlier test in the list (the shared fixtures empty the tasks, not the workflows)."""
    await pool.execute("TRUNCATE workflows CASCADE")


def register(registry: Registry, gate: dict[str, Any]) -> None:
    @registry.task("etl.fetch")
    async def fetch(payload: Any) -> list[int]:
        return list(range(ITEMS))

    @registry.task("etl.parse", max_retries=0)
    async def parse(payload: int, ctx: TaskContext) -> int:
        if payload == BAD_ITEM and ctx.workflow is not None and ctx.workflow["context"] == {"broken": True}:
            raise NonRetryableError(f"item {payload} is not a record")
        return payload * 2

    @registry.task("etl.step")
    async def step(payload: Any, ctx: TaskContext) -> str:
        return "ok"

    @registry.task("etl.slow")
    async def slow(payload: Any) -> str:
        gate["started"].set()
        if gate["hold"]:
            await anyio.sleep(60)
        return "done"


def etl(name: str, broken: bool) -> dict[str, Any]:
    """A fan-out and fan-in: fetch, then a map over its result and a side branch, joined, then published;
    with ``broken``, the map fails on one item and what follows it is skipped."""
    return {
        "name": name,
        "context": {"broken": broken},
        "nodes": [
            {"id": "fetch", "task": "etl.fetch"},
            {"id": "parse", "task": "etl.parse", "deps": ["fetch"], "map": {"from": "fetch"}},
            {"id": "enrich", "task": "etl.step", "deps": ["fetch"]},
            {"id": "audit", "task": "etl.step", "deps": ["enrich"]},
            {"id": "merge", "task": "etl.step", "deps": ["parse", "enrich"]},
            {"id": "publish", "task": "etl.step", "deps": ["merge", "audit"]},
            {"id": "notify", "task": "etl.step", "deps": ["parse"], "on_dep_failure": "ignore"},
        ],
        "on_failure": {"task": "etl.step"},
        "finally": {"task": "etl.step"},
    }


async def submitted(client: httpx.AsyncClient, key: str, body: dict[str, Any]) -> str:
    made = await client.post("/api/v1/workflows", json=body, headers=bearer(key))
    assert made.status_code == 201, made.text
    workflow_id: str = made.json()["workflow_id"]
    return workflow_id


async def read(client: httpx.AsyncClient, key: str, workflow_id: str) -> dict[str, Any]:
    got = await client.get(f"/api/v1/workflows/{workflow_id}", headers=bearer(key))
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


async def ended(client: httpx.AsyncClient, key: str, workflow_id: str) -> dict[str, Any]:
    """The workflow once nothing of it runs (``finished_at`` set)."""

    async def check() -> dict[str, Any] | None:
        body = await read(client, key, workflow_id)
        return body if body["finished_at"] is not None else None

    result: dict[str, Any] = await wait_for(check, timeout=20)
    return result


def boxes(page: Any) -> dict[str, tuple[str, str, str]]:
    """Each drawn node: its state, its box's computed fill and its text (graph and callbacks)."""
    drawn = page.execute_script(
        "return Array.from(document.querySelectorAll('svg.wf g.wf-node')).map(g => [g.dataset.node,"
        " g.dataset.state, getComputedStyle(g.querySelector('rect.box')).fill,"
        " Array.from(g.querySelectorAll('text')).map(t => t.textContent).join(' | ')]);"
    )
    return {node: (state, fill, words) for node, state, fill, words in drawn}


def click_node(page: Any, node_id: str) -> None:
    from selenium.webdriver.common.by import By

    go(page, page.find_element(By.CSS_SELECTOR, f"a.wf-link g[data-node='{node_id}'] rect.box"))


def shots(name: str, page: Any) -> None:
    """A screenshot of the page a person reads, saved for the record (``wf-<name>.png``)."""
    screenshot(page, f"wf-{name}")


async def test_the_list_shows_the_workflows_and_the_graph_colours_nodes_by_state_with_each_map_one_counted_box(
    start_instance: Any, stores: Any, registry: Registry, page: Any
) -> None:
    from selenium.webdriver.common.by import By

    register(registry, {"started": anyio.Event(), "hold": False})
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    async with start_instance(worker_concurrency=8) as inst, http(inst) as client:
        good = await submitted(client, admin, etl("nightly-etl", broken=False))
        bad = await submitted(client, admin, etl("nightly-etl-retry", broken=True))
        done, failed = await ended(client, admin, good), await ended(client, admin, bad)
        assert (done["status"], failed["status"]) == ("completed", "failed")
        failed_nodes = {n["id"]: n for n in failed["nodes"]}
        done_nodes = {n["id"]: n for n in done["nodes"]}
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            sign_in(page, base, admin)
            go(page, page.find_element(By.LINK_TEXT, "Workflows"))
            assert page.current_url == f"{base}/console/workflows"
            assert "active" in str(page.find_element(By.LINK_TEXT, "Workflows").get_attribute("class"))
            rows = {
                r.get_attribute("data-workflow"): r.text
                for r in page.find_elements(By.CSS_SELECTOR, "#workflows tbody tr")
            }
            assert list(rows) == [bad, good]  # newest first
            assert "nightly-etl-retry" in rows[bad] and "failed" in rows[bad]
            assert f"{ITEMS + 7} completed" in rows[good]  # the map's, six plain nodes' and finally's
            shots("list", page)
            page.find_element(By.CSS_SELECTOR, "#f-status option[value=failed]").click()
            go(page, page.find_element(By.CSS_SELECTOR, "#wf-search button[type=submit]"))
            assert page.current_url == f"{base}/console/workflows?status=failed"  # empty boxes left out
            assert [
                r.get_attribute("data-workflow") for r in page.find_elements(By.CSS_SELECTOR, "#workflows tbody tr")
            ] == [bad]

            page.get(f"{base}/console/workflows/{good}")
            drawn = boxes(page)
            assert set(drawn) == {
                "fetch",
                "parse",
                "enrich",
                "audit",
                "merge",
                "publish",
                "notify",
                "on_failure",
                "finally",
            }
            assert {n: s for n, (s, _, _) in drawn.items()} == {
                **dict.fromkeys(drawn, "succeeded"),
                "on_failure": "skipped",
            }
            assert all(fill == FILLS[state] for state, fill, _ in drawn.values()), drawn
            assert f"{ITEMS}/{ITEMS} completed" in drawn["parse"][2]
            callbacks = page.find_elements(By.CSS_SELECTOR, "#wf-callbacks g.wf-node")
            assert [g.get_attribute("data-node") for g in callbacks] == ["on_failure", "finally"]  # apart
            assert page.find_elements(By.ID, "wf-retry") == [] and page.find_elements(By.ID, "wf-cancel") == []
            shots("graph-completed", page)

            page.get(f"{base}/console/workflows/{bad}")
            drawn = boxes(page)
            assert {n: s for n, (s, _, _) in drawn.items()} == {
                "fetch": "succeeded",
                "parse": "failed",
                "enrich": "succeeded",
                "audit": "succeeded",
                "merge": "skipped",
                "publish": "skipped",
                "notify": "succeeded",
                "on_failure": "succeeded",
                "finally": "succeeded",
            }
            assert all(fill == FILLS[state] for state, fill, _ in drawn.values()), drawn
            assert len({fill for _, fill, _ in drawn.values()}) == 3  # three states, three colours
            assert f"{ITEMS - 1}/{ITEMS} completed, 1 failed" in drawn["parse"][2]
            assert len(page.find_elements(By.CSS_SELECTOR, "path.wf-edge.from-failed")) == 2  # parse's
            assert text(page, "#wf-retry button") == "Retry from where it stopped"
            shots("graph-failed", page)
            page.set_window_size(1360, 1600)  # the whole card in view: an element's picture is cut at the window
            page.find_element(By.ID, "wf-graph").screenshot(str(ARTEFACTS / "wf-graph-failed-card.png"))
            page.set_window_size(1360, 900)

            click_node(page, "parse")  # a map node: its failed task
            assert page.current_url.rsplit("/", 1)[-1] in failed_nodes["parse"]["task_ids"]
            assert text(page, "h1") == "etl.parse failed"
            assert f"item {BAD_ITEM} is not a record" in text(page, "#runs")
            page.back()
            click_node(page, "enrich")  # a plain node: its task
            assert page.current_url == f"{base}/console/tasks/{failed_nodes['enrich']['task_id']}"
            page.get(f"{base}/console/workflows/{good}")
            click_node(page, "parse")  # a map without a failure: its first task
            assert page.current_url.rsplit("/", 1)[-1] == done_nodes["parse"]["task_ids"][0]
            assert "completed" in texts(page, "h1 .status")

        await in_browser(steps)


def submit_form(page: Any, action: str, fields: dict[str, str]) -> None:
    """Send a form to ``action`` as the page's own would be (its session's CSRF token), for a button the page
    does not offer: the browser then shows the answer."""
    from selenium.webdriver.common.by import By

    csrf = page.find_element(By.CSS_SELECTOR, ".who input[name=csrf_token]").get_attribute("value")
    old = page.find_element(By.TAG_NAME, "html")
    page.execute_script(
        "const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];"
        "for (const [k, v] of Object.entries(arguments[1])) {"
        " const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v; f.append(i); }"
        "document.body.append(f); f.submit();",
        action,
        {"csrf_token": csrf, **fields},
    )
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.console.conftest import _is_stale

    WebDriverWait(page, 15).until(lambda _: _is_stale(old))


@pytest.fixture
def gate() -> Iterator[dict[str, Any]]:
    """Holds ``etl.slow`` running (``hold``) and says when it started."""
    yield {"started": anyio.Event(), "hold": True}


async def test_cancel_with_a_reason_then_retry_from_the_workflows_page_and_watch_it_complete(
    start_instance: Any, stores: Any, registry: Registry, page: Any, gate: dict[str, Any]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    register(registry, gate)
    operator = (await api_keys.create(stores.pg, "oncall", list(api_keys.ROLES["operator"]))).key
    body = {
        "name": "slow-report",
        "nodes": [
            {"id": "build", "task": "etl.slow"},
            {"id": "send", "task": "etl.step", "deps": ["build"]},
        ],
    }
    async with start_instance(lease_seconds=3) as inst, http(inst) as client:
        wid = await submitted(client, operator, body)
        with anyio.fail_after(10):
            await gate["started"].wait()
        base = f"http://127.0.0.1:{inst.port}"

        def cancel_steps() -> None:
            sign_in(page, base, operator)
            page.get(f"{base}/console/workflows/{wid}")
            assert {n: s for n, (s, _, _) in boxes(page).items()} == {"build": "running", "send": "blocked"}
            assert "waiting for build" in boxes(page)["send"][2]
            assert page.find_elements(By.ID, "wf-retry") == []
            shots("graph-running", page)
            page.find_element(By.CSS_SELECTOR, "#wf-cancel summary").click()
            page.find_element(By.CSS_SELECTOR, "#wf-cancel input[name=reason]").send_keys("wrong month")
            go(page, page.find_element(By.CSS_SELECTOR, "#wf-cancel button[type=submit]"))
            assert text(page, ".flash.ok") == "Workflow cancelled: 1 task ended now; 1 running task asked to stop."
            assert text(page, "#wf-status") == "cancelled"
            assert text(page, "#wf-cancel-reason") == "wrong month"

        await in_browser(cancel_steps)
        await ended(client, operator, wid)  # the running task stopped
        gate["hold"] = False

        def retry_steps() -> None:
            page.get(f"{base}/console/workflows/{wid}")
            assert {n: s for n, (s, _, _) in boxes(page).items()} == {"build": "cancelled", "send": "cancelled"}
            shots("graph-cancelled", page)
            go(page, page.find_element(By.CSS_SELECTOR, "#wf-retry button"))
            assert text(page, ".flash.ok").startswith("Workflow retried from where it stopped: ")
            page.execute_script("window.notReloaded = true;")
            # The page follows the running workflow by itself until it ends.
            WebDriverWait(page, 30, poll_frequency=0.5).until(lambda d: text(d, "#wf-status") == "completed")
            assert page.execute_script("return window.notReloaded === true;")
            WebDriverWait(page, 10, poll_frequency=0.5).until(
                lambda d: {s for s, _, _ in boxes(d).values()} == {"succeeded"}
            )

        await in_browser(retry_steps)
        assert (await read(client, operator, wid))["status"] == "completed"


async def test_a_key_without_tasks_cancel_sees_no_cancel_and_gets_the_apis_refusal_and_a_stale_button_its_conflict(
    start_instance: Any, stores: Any, registry: Registry, pool: asyncpg.Pool, page: Any, gate: dict[str, Any]
) -> None:
    from selenium.webdriver.common.by import By

    register(registry, gate)
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    writer = (await api_keys.create(stores.pg, "writer", ["tasks:read", "tasks:write"])).key
    body = {"name": "held", "nodes": [{"id": "build", "task": "etl.slow"}]}
    async with start_instance(lease_seconds=3) as inst, http(inst) as client:
        wid = await submitted(client, admin, body)
        with anyio.fail_after(10):
            await gate["started"].wait()
        base = f"http://127.0.0.1:{inst.port}"

        def refused_steps() -> None:
            sign_in(page, base, writer)
            page.get(f"{base}/console/workflows/{wid}")
            assert page.find_elements(By.ID, "wf-cancel") == []  # not offered to this key
            submit_form(page, f"/console/workflows/{wid}/cancel", {"reason": "not mine to stop"})
            assert text(page, "#refused h1") == "Not cancelled"
            assert "Forbidden" in text(page, "#refused .refused") and "tasks:cancel" in text(page, "#refused")
            shots("refused", page)
            page.get(f"{base}/console/workflows/{wid}")
            assert text(page, "#wf-status") == "running"
            page.delete_all_cookies()

        await in_browser(refused_steps)
        assert (await read(client, admin, wid))["status"] == "running"

        def open_as_admin() -> None:
            sign_in(page, base, admin)
            page.get(f"{base}/console/workflows/{wid}")
            # A page opened before the workflow ended and no longer following it (a laptop asleep).
            page.execute_script(
                "document.querySelectorAll('[data-live]').forEach(s => s.removeAttribute('data-live'));"
            )
            page.find_element(By.CSS_SELECTOR, "#wf-cancel summary").click()

        await in_browser(open_as_admin)
        cancelled = await client.post(f"/api/v1/workflows/{wid}/cancel", headers=bearer(admin))
        assert cancelled.status_code == 200
        await ended(client, admin, wid)
        retried = await client.post(f"/api/v1/workflows/{wid}/retry", headers=bearer(admin))
        assert retried.status_code == 200
        gate["hold"] = False
        assert (await ended(client, admin, wid))["status"] == "completed"

        def conflict_steps() -> None:
            go(page, page.find_element(By.CSS_SELECTOR, "#wf-cancel button[type=submit]"))
            problem = text(page, ".flash.bad")
            assert problem.startswith("Not cancelled: ") and "is completed" in problem, problem
            assert text(page, "#wf-status") == "completed"

        await in_browser(conflict_steps)
    denied = await pool.fetch("SELECT actor_name, outcome FROM audit_events WHERE action = 'workflow.cancel'")
    assert sorted((r["actor_name"], r["outcome"]) for r in denied) == [
        ("admin", "error"),
        ("admin", "ok"),
        ("writer", "denied"),
    ]


async def test_a_tenant_key_lists_and_opens_only_its_tenants_workflows(
    start_instance: Any, stores: Any, page: Any
) -> None:
    from selenium.webdriver.common.by import By

    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    acme = (await api_keys.create(stores.pg, "acme-ops", list(api_keys.ROLES["operator"]), tenant_id="acme")).key
    body = {
        "name": "invoices",
        "nodes": [{"id": "a", "task": "report.build"}, {"id": "b", "task": "report.build", "deps": ["a"]}],
    }
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        ours = await submitted(client, acme, body)
        theirs = await submitted(client, admin, {**body, "tenant_id": "globex"})
        base = f"http://127.0.0.1:{inst.port}"

        def steps() -> None:
            sign_in(page, base, acme)
            page.get(f"{base}/console/workflows")
            listed = [
                r.get_attribute("data-workflow") for r in page.find_elements(By.CSS_SELECTOR, "#workflows tbody tr")
            ]
            assert listed == [ours]
            assert page.find_elements(By.ID, "f-tenant") == []  # its tenant is the only one it sees
            page.get(f"{base}/console/workflows?tenant_id=globex")
            assert text(page, "main .empty") == "No workflow matches these filters."
            page.get(f"{base}/console/workflows/{theirs}")
            assert "not found" in text(page, ".refused").lower()
            page.get(f"{base}/console/workflows/{ours}")
            assert {n: s for n, (s, _, _) in boxes(page).items()} == {"a": "running", "b": "blocked"}
            assert boxes(page)["b"][2].endswith("waiting for a")
            assert text(page, "#wf-table tr[data-node=b] td.waiting") == "a"

        await in_browser(steps)
