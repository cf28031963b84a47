"""A console page that shows the API's refusal answers with the API's status: 403 for a key that may not see
it, 429 (with ``Retry-After``) for a key past its rate limit, for pages and for forms alike.

Plain HTTP with a signed-in session: the status is what a proxy, a monitor or a script sees.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from tests.console.test_console_sessions import client_of, signed_in

pytestmark = pytest.mark.anyio

TRIES = 10
"""Requests a test makes at most to spend a key's burst (a rate of 1/s bursts 2)."""


async def test_a_page_the_api_refuses_answers_403_and_a_page_it_can_show_answers_200(
    start_instance: Any, stores: Any
) -> None:
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    tenant = (await api_keys.create(stores.pg, "acme", list(api_keys.ROLES["operator"]), tenant_id="acme")).key
    viewer = (await api_keys.create(stores.pg, "looker", list(api_keys.ROLES["viewer"]))).key
    async with start_instance(workers_enabled=False) as inst:
        async with client_of(inst) as as_admin, client_of(inst) as as_tenant, client_of(inst) as as_viewer:
            await signed_in(as_admin, admin)
            await signed_in(as_tenant, tenant)
            await signed_in(as_viewer, viewer)
            shown = {path: (await as_admin.get(path)).status_code for path in ("/console/queues", "/console/audit")}
            refused = {
                "/console/queues": await as_tenant.get("/console/queues"),
                "/console/dlq": await as_tenant.get("/console/dlq"),
                "/console/workers": await as_tenant.get("/console/workers"),
                "/console/audit": await as_viewer.get("/console/audit"),
            }
            tenant_tasks = await as_tenant.get("/console/tasks")
    assert shown == {"/console/queues": 200, "/console/audit": 200}
    assert {path: answer.status_code for path, answer in refused.items()} == dict.fromkeys(refused, 403)
    assert (
        "the queue list covers every tenant; this key is bound to tenant &#39;acme&#39;"
        in refused["/console/queues"].text
    )
    assert 'class="refused">Forbidden' in refused["/console/audit"].text
    assert tenant_tasks.status_code == 200  # its own tenant's search: a page, not a refusal


async def _until_limited(send: Any) -> list[httpx.Response]:
    answers = []
    for _ in range(TRIES):
        answers.append(await send())
        if answers[-1].status_code == 429:
            break
    return answers


async def test_a_page_and_a_form_past_the_keys_rate_limit_answer_429_with_retry_after(
    start_instance: Any, stores: Any
) -> None:
    slow = await api_keys.create(stores.pg, "slow", list(SCOPES), rate_limits={"read": 1, "admin": 1})
    async with start_instance(workers_enabled=False) as inst, client_of(inst) as client:
        token = await signed_in(client, slow.key)
        reads = await _until_limited(lambda: client.get("/console/tasks"))
        verbs = iter(["pause", "resume"] * TRIES)
        changes = await _until_limited(
            lambda: client.post(f"/console/queues/default/{next(verbs)}", data={"csrf_token": token})
        )
    page, form = reads[-1], changes[-1]
    assert [a.status_code for a in reads[:-1]] == [200] * (len(reads) - 1)
    assert page.status_code == 429, [a.status_code for a in reads]
    assert int(page.headers["retry-after"]) >= 1
    assert 'class="refused">Too many requests' in page.text
    assert [a.status_code for a in changes[:-1]] == [303] * (len(changes) - 1)
    assert form.status_code == 429, [a.status_code for a in changes]
    assert int(form.headers["retry-after"]) >= 1
    assert "<h1>Not paused</h1>" in form.text or "<h1>Not resumed</h1>" in form.text
    assert "Too many requests" in form.text and "Try again in" in form.text
