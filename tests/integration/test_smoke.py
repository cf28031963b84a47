from __future__ import annotations

from typing import Any

import pytest

from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio


async def test_an_instance_runs_an_async_task_to_completion(start_instance: Any, registry: Registry, pool: Any) -> None:
    @registry.task("smoke.add")
    async def add(payload: dict[str, int]) -> int:
        return payload["a"] + payload["b"]

    async with start_instance() as inst, http(inst) as client:
        r = await client.post("/api/v1/tasks", json={"name": "smoke.add", "payload": {"a": 2, "b": 3}})
        assert r.status_code == 201, r.text
        task_id = r.json()["task_id"]

        async def done() -> Any:
            body = (await client.get(f"/api/v1/tasks/{task_id}")).json()
            return body if body["task"]["status"] == "completed" else None

        body = await wait_for(done)
        assert body["latest_run"]["status"] == "succeeded"
        assert body["latest_run"]["result"] == 5


async def test_the_openapi_document_lists_every_route(start_instance: Any) -> None:
    async with start_instance() as inst, http(inst) as client:
        spec = (await client.get("/openapi.json")).json()
    assert set(spec["paths"]) == {
        "/api/v1/tasks",
        "/api/v1/tasks:batch",
        "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/{task_id}/runs",
        "/api/v1/tasks/{task_id}/cancel",
        "/api/v1/workers",
        "/api/v1/tasks/{task_id}/retry",
        "/api/v1/tasks:bulk",
        "/api/v1/operations/{operation_id}",
        "/api/v1/workflows",
        "/api/v1/workflows:batch",
        "/api/v1/workflows/{workflow_id}",
        "/api/v1/workflows/{workflow_id}/cancel",
        "/api/v1/workflows/{workflow_id}/retry",
        "/api/v1/queues",
        "/api/v1/history",
        "/api/v1/queues/{queue}",
        "/api/v1/queues/{queue}/pause",
        "/api/v1/queues/{queue}/resume",
        "/api/v1/queues/{queue}/dlq",
        "/api/v1/queues/{queue}/dlq/replay",
        "/api/v1/schedules",
        "/api/v1/schedules/{name}",
        "/api/v1/schedules/{name}/trigger",
        "/api/v1/schedules/{name}/pause",
        "/api/v1/schedules/{name}/resume",
        "/api/v1/keys",
        "/api/v1/audit",
        "/api/v1/limits",
        "/api/v1/limits/{limit}",
        "/api/v1/keys/{key_id}/revoke",
        "/api/v1/keys/{key_id}/rotate",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    body = spec["paths"]["/api/v1/tasks"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/TaskSpec"}
    assert spec["components"]["schemas"]["TaskSpec"]["properties"]["priority"]["maximum"] == 1000


async def test_fifty_parallel_http_creates_with_one_dedup_key_make_one_task(start_instance: Any, pool: Any) -> None:
    import anyio

    answers: list[tuple[int, str]] = []
    async with start_instance() as inst, http(inst) as client:

        async def create() -> None:
            r = await client.post("/api/v1/tasks", json={"name": "x", "dedup_key": "one-key"})
            answers.append((r.status_code, r.json()["task_id"]))

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(create)
    assert sorted(code for code, _ in answers) == [200] * 49 + [201]
    assert len({tid for _, tid in answers}) == 1
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1


async def test_the_api_documentation_pages_load_every_asset_from_the_instance(start_instance: Any) -> None:
    import re

    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        for page in ("/docs", "/redoc"):
            r = await client.get(page)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), page
            assets = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]+)['"]""", r.text)
            assert assets, page
            for url in assets:
                assert not url.startswith(("http://", "https://", "//")), f"{page} loads {url} from elsewhere"
                assert (await client.get(url)).status_code == 200, url


async def test_every_path_parameter_is_typed_in_the_openapi_document(start_instance: Any) -> None:
    from taskmesh.limits.settings import LIMIT_NAME
    from taskmesh.tasks.validation import NAME_REGEX

    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        spec = (await client.get("/openapi.json")).json()
    wanted = {"task_id": {"type": "string", "format": "uuid"}, "queue": {"type": "string", "pattern": NAME_REGEX}}
    wanted["name"] = wanted["queue"]
    wanted["operation_id"] = wanted["workflow_id"] = wanted["task_id"]
    wanted["key_id"] = {"type": "string", "pattern": "^[a-z2-7]{16}$"}
    wanted["limit"] = {"type": "string", "pattern": LIMIT_NAME.pattern}
    seen = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for param in operation.get("parameters", []):
                if param["in"] == "path":
                    seen += 1
                    schema = {k: v for k, v in param["schema"].items() if k in ("type", "format", "pattern")}
                    assert schema == wanted[param["name"]], f"{method.upper()} {path}: {param}"
    assert seen >= 17


CREATES = ("/api/v1/tasks", "/api/v1/tasks:batch")
"""Creates answer 409 too: a dedup key another tenant's task has, between an upgrade's expand and contract steps."""
NAMED = ("{task_id}", "{operation_id}", "{name}", "{key_id}", "{workflow_id}", "{limit}")
"""Path parameters that name a thing which may not exist (404); a ``PUT`` makes its thing, so it has no 404."""


async def test_every_api_route_documents_its_errors_as_problems_and_the_search_its_parameters(
    start_instance: Any,
) -> None:
    from taskmesh.tasks.search import FILTERS

    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        spec = (await client.get("/openapi.json")).json()
    checked = 0
    for path, operations in spec["paths"].items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            errors = {int(s) for s in operation["responses"] if int(s) >= 400}
            wanted = {400, 401, 403, 429, 500, 503}  # a Host not allowed; a scope and a rate limit
            if any(p in path for p in NAMED) and method != "put":
                wanted.add(404)
            if operation.get("parameters"):
                wanted.add(422)
            if "requestBody" in operation:
                wanted |= {400, 413, 415, 422}
            # A task's delete meets its state (a running task); a limit's delete has no state to meet.
            deletes_a_task = method == "delete" and path == "/api/v1/tasks/{task_id}"
            if deletes_a_task or path.endswith(("/cancel", "/retry")) or (method == "post" and path in CREATES):
                wanted.add(409)
            assert errors == wanted, where
            for status in errors:
                content = operation["responses"][str(status)]["content"]
                assert set(content) == {"application/problem+json"}, (where, status)
            checked += 1
    assert checked == 38
    search = spec["paths"]["/api/v1/tasks"]["get"]
    assert {p["name"] for p in search["parameters"]} == {*FILTERS, "payload.{path}"}


async def test_health_checks_answer_head_as_load_balancers_send_it(start_instance: Any) -> None:
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        for path in ("/healthz", "/readyz"):
            r = await client.head(path)
            assert (r.status_code, r.content) == (200, b""), path
