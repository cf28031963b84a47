"""What a browser can be made to send: bodies that are not JSON (415) and Hosts not allowed (400)."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest

from taskmesh.config import load_settings
from taskmesh.errors import ConfigError
from taskmesh.security import keys as api_keys
from tests.integration.test_api_bad_input import PROBLEM

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"


def raw(inst: Any) -> httpx.AsyncClient:
    """A client that sets no Content-Type of its own (unlike ``tests.conftest.http``)."""
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{inst.port}", timeout=10)


def unsupported(media: str) -> dict[str, Any]:
    return {
        "type": "about:blank",
        "title": "Unsupported media type",
        "status": 415,
        "detail": f"Content-Type: send the body as application/json, not {media}",
        "errors": [{"field": "Content-Type", "message": "must be application/json"}],
    }


async def test_a_body_that_is_not_json_is_refused_with_415_and_writes_nothing(
    start_instance: Any, pool: asyncpg.Pool
) -> None:
    body = b'{"name": "from.a.form"}'
    async with start_instance(workers_enabled=False) as inst, raw(inst) as client:
        answers = {
            media: await client.post(TASKS, content=body, headers={"Content-Type": media})
            for media in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x")
        }
        untyped = await client.post(TASKS, content=body)
        json_utf8 = await client.post(TASKS, content=body, headers={"Content-Type": "application/json; charset=utf-8"})
        created = json_utf8.json()["task_id"]
        # A POST with no body needs no type: the CLI's cancel sends none.
        cancel = await client.post(f"{TASKS}/{created}/cancel")
    for media, r in answers.items():
        assert (r.status_code, r.headers["content-type"]) == (415, PROBLEM), media
        assert r.json() == unsupported(media.split(";")[0])
    assert untyped.json() == unsupported("without a type")
    assert json_utf8.status_code == 201
    assert cancel.status_code == 200, cancel.text
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1


async def test_a_loopback_instance_answers_only_its_loopback_names_and_probes_any(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, raw(inst) as client:
        rebound = await client.get(TASKS, headers={"Host": f"evil.example:{inst.port}"})
        local = await client.get(TASKS, headers={"Host": f"localhost:{inst.port}"})
        v6 = await client.get(TASKS, headers={"Host": f"[::1]:{inst.port}"})
        probe = await client.get("/readyz", headers={"Host": "evil.example"})
    assert rebound.status_code == 400 and rebound.json() == {
        "type": "about:blank",
        "title": "Host not allowed",
        "status": 400,
        "detail": "Host 'evil.example' is not one of allowed_hosts (localhost, 127.0.0.1, ::1)",
        "errors": [{"field": "Host", "message": "not one of allowed_hosts"}],
    }
    assert (local.status_code, v6.status_code, probe.status_code) == (200, 200, 200)


async def test_allowed_hosts_names_the_proxys_public_names(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False, allowed_hosts="api.example.com,*.tm.example") as inst:
        async with raw(inst) as client:
            public = await client.get(TASKS, headers={"Host": "api.example.com"})
            sub = await client.get(TASKS, headers={"Host": "eu.tm.example:443"})
            direct = await client.get(TASKS)
    assert (public.status_code, sub.status_code, direct.status_code) == (200, 200, 400)


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


async def test_no_cors_unless_configured_then_only_for_the_listed_origins(start_instance: Any) -> None:
    page = {"Origin": "https://ops.example.com"}
    keyed = {**page, "Authorization": "Bearer tmk_any_key"}  # an open instance takes any key
    async with start_instance(workers_enabled=False) as inst, raw(inst) as client:
        closed_read = await client.get(TASKS, headers=keyed)
        closed_preflight = await client.options(TASKS, headers={**page, **PREFLIGHT})
    assert closed_read.status_code == 200 and "access-control-allow-origin" not in closed_read.headers
    assert closed_preflight.status_code == 403  # refused as another site's request: preflights carry no key
    assert not any(h.startswith("access-control-") for h in closed_preflight.headers)

    async with start_instance(workers_enabled=False, cors_allowed_origins="https://ops.example.com") as inst:
        async with raw(inst) as client:
            preflight = await client.options(TASKS, headers={**page, **PREFLIGHT})
            read = await client.get(TASKS, headers=keyed)
            form = await client.post(TASKS, content=b"name=x", headers={**keyed, "Content-Type": "text/plain"})
            unkeyed = await client.get(TASKS, headers=page)
            stranger = await client.options(TASKS, headers={"Origin": "https://evil.example", **PREFLIGHT})
            stranger_read = await client.get(TASKS, headers={"Origin": "https://evil.example"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://ops.example.com"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= set(
        preflight.headers["access-control-allow-headers"].lower().split(", ")
    )
    assert read.status_code == 200
    assert read.headers["access-control-allow-origin"] == "https://ops.example.com"
    assert "RateLimit" in read.headers["access-control-expose-headers"]
    # CORS lets a listed page read answers; it never lets a body through that is not JSON.
    assert form.status_code == 415 and form.headers["access-control-allow-origin"] == "https://ops.example.com"
    # A listed page still needs a key: CORS says who may read answers, not who may act.
    assert unkeyed.status_code == 403 and unkeyed.headers["access-control-allow-origin"] == "https://ops.example.com"
    assert stranger.status_code == 400 and "access-control-allow-origin" not in stranger.headers
    assert stranger_read.status_code == 403 and "access-control-allow-origin" not in stranger_read.headers


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("https://ops.example.com/", "'https://ops.example.com/' is not an origin"),
        ("ops.example.com", "'ops.example.com' is not an origin"),
    ],
)
def test_a_cors_origin_that_is_not_an_origin_is_a_config_error(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(cors_allowed_origins=value)
    assert str(caught.value) == (
        f"invalid configuration: cors_allowed_origins: {message}: give scheme://host[:port] (no path), or *"
    )


PAUSE = "/api/v1/queues/default/pause"
KEY_NEEDED = "a page of another site may not call the API without an API key (Authorization: Bearer, or X-API-Key)"


def cross_site(field: str, detail: str, message: str) -> dict[str, Any]:
    return {
        "type": "about:blank",
        "title": "Cross-site request refused",
        "status": 403,
        "detail": f"{field}: {detail}",
        "errors": [{"field": field, "message": message}],
    }


@pytest.mark.parametrize(
    ("headers", "field", "detail", "message"),
    [
        (
            {"Sec-Fetch-Site": "cross-site"},
            "Sec-Fetch-Site",
            f"cross-site: {KEY_NEEDED}",
            "cross-site: another site's page, without an API key",
        ),
        (
            {"Sec-Fetch-Site": "cross-site", "Authorization": "Basic dXNlcjpwYXNz"},  # remembered by the browser
            "Sec-Fetch-Site",
            f"cross-site: {KEY_NEEDED}",
            "cross-site: another site's page, without an API key",
        ),
        (
            {"Sec-Fetch-Site": "same-site"},
            "Sec-Fetch-Site",
            f"same-site: {KEY_NEEDED}",
            "same-site: another site's page, without an API key",
        ),
        (
            {"Origin": "https://evil.example"},
            "Origin",
            f"https://evil.example is not this host (127.0.0.1:{{port}}): {KEY_NEEDED}",
            "another host's page, without an API key",
        ),
        (
            {"Origin": "http://127.0.0.1:1"},
            "Origin",
            f"http://127.0.0.1:1 is not this host (127.0.0.1:{{port}}): {KEY_NEEDED}",
            "another host's page, without an API key",
        ),
        (
            {"Origin": "null"},  # a sandboxed frame's, or a page's after a cross-site redirect
            "Origin",
            f"null is not this host (127.0.0.1:{{port}}): {KEY_NEEDED}",
            "another host's page, without an API key",
        ),
    ],
    ids=[
        "cross-site",
        "cross-site-with-basic-credentials",
        "same-site",
        "origin-of-another-host",
        "origin-of-another-port",
        "origin-null",
    ],
)
async def test_a_request_from_another_sites_page_without_a_key_is_refused_with_403_on_an_open_instance(
    start_instance: Any, headers: dict[str, str], field: str, detail: str, message: str
) -> None:
    # The attack: an open instance (no key made yet, as after `make run`) and a page on another site
    # that POSTs with no body, which a browser sends without asking (no preflight).
    async with start_instance(workers_enabled=False) as inst, raw(inst) as client:
        refused = await client.post(PAUSE, headers=headers)
        read = await client.get("/api/v1/queues/default", headers=headers)
        queue = await client.get("/api/v1/queues/default")
    assert (refused.status_code, refused.headers["content-type"]) == (403, PROBLEM)
    assert refused.json() == cross_site(field, detail.format(port=inst.port), message)
    assert read.status_code == 403
    assert queue.json()["paused"] is False


async def test_a_request_from_this_origin_a_cli_or_one_with_a_key_is_let_through(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, raw(inst) as client:
        this = f"http://127.0.0.1:{inst.port}"
        codes = {
            "same-origin": (await client.post(PAUSE, headers={"Sec-Fetch-Site": "same-origin", "Origin": this})),
            "typed-in": (await client.get("/api/v1/queues/default", headers={"Sec-Fetch-Site": "none"})),
            "by-name": (
                await client.post(
                    PAUSE, headers={"Host": f"localhost:{inst.port}", "Origin": f"http://LOCALHOST:{inst.port}"}
                )
            ),
            "cli": (await client.post(PAUSE)),
            "bearer": (
                await client.post(
                    PAUSE, headers={"Sec-Fetch-Site": "cross-site", "Authorization": "Bearer tmk_any_key"}
                )
            ),
            "x-api-key": (
                await client.post(PAUSE, headers={"Origin": "https://ops.example", "X-API-Key": "tmk_any_key"})
            ),
        }
    assert {name: r.status_code for name, r in codes.items()} == dict.fromkeys(codes, 200)


async def test_a_keyed_instance_refuses_another_sites_page_without_a_key_and_serves_it_with_one(
    start_instance: Any, stores: Any, pool: asyncpg.Pool
) -> None:
    key = (await api_keys.create(stores.pg, "ops", ["tasks:read", "queues:admin"])).key
    page = {"Sec-Fetch-Site": "cross-site", "Origin": "https://ops.example"}
    try:
        async with start_instance(workers_enabled=False) as inst, raw(inst) as client:
            without = await client.post(PAUSE, headers=page)
            with_key = await client.post(PAUSE, headers={**page, "Authorization": f"Bearer {key}"})
    finally:
        await pool.execute("TRUNCATE api_keys, console_sessions")
    assert (without.status_code, without.json()["errors"][0]["field"]) == (403, "Sec-Fetch-Site")
    assert with_key.status_code == 200 and with_key.json()["paused"] is True


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect"])
async def test_the_api_docs_pages_may_not_be_framed_by_another_page(start_instance: Any, path: str) -> None:
    async with start_instance(workers_enabled=False) as inst, raw(inst) as client:
        page = await client.get(path)
        api = await client.get("/api/v1/queues/default")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == "frame-ancestors 'none'"
    assert page.headers["x-frame-options"] == "DENY"
    assert "content-security-policy" not in api.headers
