"""The console's pages load at its first request, not at the instance's start (start-up).

An instance that never serves a console page never imports its pages, templates or API client;
the first request under ``/console`` loads them and is answered as every later one is, an
unknown path under ``/console`` included.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import httpx
import pytest

from taskmesh.console.guard import CSP
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES

pytestmark = pytest.mark.anyio

PAGES = ("taskmesh.console.pages", "taskmesh.console.web", "taskmesh.console.api_client", "jinja2")

BUILD_APP = """
import sys
from taskmesh.runtime import supervisor
from taskmesh.api.app import create_app
from taskmesh.api.state import AppState
from taskmesh.observability.metrics import Metrics

create_app(AppState(metrics=Metrics(), queues=["default"]), console_enabled=True)
print(",".join(m for m in {pages!r} if m in sys.modules))
"""


def test_an_instance_builds_its_app_without_loading_the_console_pages() -> None:
    code = BUILD_APP.format(pages=PAGES)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"loaded at start: {done.stdout.strip()}"


async def test_the_first_console_request_loads_the_pages_and_is_answered_like_every_later_one(
    start_instance: Any, stores: Any
) -> None:
    await api_keys.create(stores.pg, "admin", list(SCOPES))  # not open: the sign-in page is a form
    async with (
        start_instance(workers_enabled=False) as inst,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{inst.port}", timeout=10) as client,
    ):
        first_unknown = await client.get("/console/nope")
        sign_in = await client.get("/console/sign-in")
        style = await client.get("/console/static/console.css")
        later_unknown = await client.get("/console/nope")
        wrong_method = await client.delete("/console/sign-in")
        metrics = (await client.get("/metrics")).text
    for answer in (first_unknown, later_unknown):
        assert answer.status_code == 404
        assert answer.headers["content-type"] == "application/problem+json"
        assert (answer.json()["title"], answer.json()["detail"]) == ("Not Found", "Not Found")
        assert answer.headers["content-security-policy"] == CSP
    assert sign_in.status_code == 200 and "<form" in sign_in.text
    assert sign_in.headers["content-security-policy"] == CSP
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert (wrong_method.status_code, wrong_method.json()["title"]) == (405, "Method Not Allowed")
    # The request metric names the page's own route, as it did when the routes were there from the start.
    assert re.search(r'taskmesh_http_requests_total\{method="GET",route="/console/sign-in",status="200"\}', metrics), [
        line for line in metrics.splitlines() if "console" in line
    ]


async def test_the_first_request_for_the_console_with_a_trailing_slash_is_redirected_as_later_ones_are(
    start_instance: Any, stores: Any
) -> None:
    await api_keys.create(stores.pg, "admin", list(SCOPES))
    async with (
        start_instance(workers_enabled=False) as inst,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{inst.port}", timeout=10) as client,
    ):
        first = await client.get("/console/")
        later = await client.get("/console/")
    for answer in (first, later):
        assert (answer.status_code, answer.headers["location"]) == (307, f"http://127.0.0.1:{inst.port}/console")
