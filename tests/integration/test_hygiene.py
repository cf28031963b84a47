"""What a browser can be made to send (issue 12): bodies that are not JSON (415) and Hosts not allowed (400)."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest

from taskmesh.config import load_settings
from taskmesh.errors import ConfigError
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
    async with start_instance(workers_enabled=False) as inst, raw(inst) as client:
        closed_read = await client.get(TASKS, headers=page)
        closed_preflight = await client.options(TASKS, headers={**page, **PREFLIGHT})
    assert closed_read.status_code == 200 and "access-control-allow-origin" not in closed_read.headers
    assert closed_preflight.status_code == 405
    assert not any(h.startswith("access-control-") for h in closed_preflight.headers)

    async with start_instance(workers_enabled=False, cors_allowed_origins="https://ops.example.com") as inst:
        async with raw(inst) as client:
            preflight = await client.options(TASKS, headers={**page, **PREFLIGHT})
            read = await client.get(TASKS, headers=page)
            form = await client.post(TASKS, content=b"name=x", headers={**page, "Content-Type": "text/plain"})
            stranger = await client.options(TASKS, headers={"Origin": "https://evil.example", **PREFLIGHT})
            stranger_read = await client.get(TASKS, headers={"Origin": "https://evil.example"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://ops.example.com"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= set(
        preflight.headers["access-control-allow-headers"].lower().split(", ")
    )
    assert read.headers["access-control-allow-origin"] == "https://ops.example.com"
    assert "RateLimit" in read.headers["access-control-expose-headers"]
    # CORS lets a listed page read answers; it never lets a body through that is not JSON.
    assert form.status_code == 415 and form.headers["access-control-allow-origin"] == "https://ops.example.com"
    assert stranger.status_code == 400 and "access-control-allow-origin" not in stranger.headers
    assert stranger_read.status_code == 200 and "access-control-allow-origin" not in stranger_read.headers


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
