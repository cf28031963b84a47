"""The OpenAPI document as a contract, checked against a live instance on real PostgreSQL and Redis.

Two tests:

- every route is called the ways that give each of its answers (a create with warnings and a deduplicated
  one, a running and a queued cancel, a rejected batch item, a dead-lettered task with its traceback, a
  rotated key, ...), and every answer must be one the document declares for its operation: its status,
  its content type, and a body valid against the schema, read strictly (an object may hold no member its
  schema does not name, so an undocumented field fails too; formats such as ``date-time`` and ``uuid`` are
  checked);
- a client generated from the instance's own ``/openapi.json`` by openapi-python-client (run from its own
  virtualenv, ``.venv/codegen``: its pin on Typer conflicts with the CLI's) is imported and drives create,
  get, search and cancel; its models must be the document's shared schemas (``Task``, ``Problem``, ...),
  not one class per operation and status.
"""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import jsonschema
import orjson
import pytest

from taskmesh import NonRetryableError
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

WORK_QUEUE = "contractwork"
SCHEDULE = {"name": "contract-yearly", "cron": "@yearly", "task": "contract.idle", "queue": "default"}
LIMIT = "contract-slow"
LIMITS = {LIMIT: {"task": "contract.slow", "concurrency": 1}}
"""One run of ``contract.slow`` at a time: a second one waits, so the limit has usage to show."""
GENERATOR = Path(sys.prefix) / "codegen" / "bin" / "openapi-python-client"
"""Installed by ``make install`` in a virtualenv of its own inside ``.venv``."""
MODEL_CLASSES_MOST = 125
"""The generated client's model classes: 115 with shared schemas, the workflows' and the limits' included (419
with one per operation and status before them)."""


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions")


def register_handlers(registry: Registry, release: anyio.Event) -> None:
    @registry.task("contract.ok", queue=WORK_QUEUE)
    async def ok(payload: Any) -> dict[str, Any]:
        return {"rows": 3, "echo": payload}

    @registry.task("contract.fail", queue=WORK_QUEUE, max_retries=0)
    async def fail(payload: Any) -> None:
        raise NonRetryableError("contract: refused on purpose")

    @registry.task("contract.slow", queue=WORK_QUEUE)
    async def slow(payload: Any) -> None:
        await release.wait()

    @registry.task("contract.idle", queue="default")  # a queue this instance does not work
    async def idle(payload: Any) -> None:
        return None


@dataclass(frozen=True)
class Answer:
    """One call and what the instance answered, by the document's path template."""

    method: str
    path: str
    status: int
    content_type: str
    body: bytes


class Recorder:
    """Calls the instance and keeps every answer, to check them all against the document afterwards."""

    def __init__(self, client: httpx.AsyncClient, key: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"}
        self.answers: list[Answer] = []

    async def call(self, method: str, template: str, expected: int, body: Any = None, **params: Any) -> Any:
        """``method`` on ``template`` with its ``{names}`` filled from ``params`` (the rest as the query)."""
        names = {k: v for k, v in params.items() if "{" + k + "}" in template}
        query = {k: v for k, v in params.items() if k not in names}
        url = template.format(**names)
        answer = await self.client.request(
            method, url, json=body, params=query, headers=self.headers, timeout=30 if "wait" in query else 10
        )
        assert answer.status_code == expected, f"{method} {url}: {answer.status_code} {answer.text}"
        content_type = answer.headers.get("content-type", "").split(";")[0]
        self.answers.append(Answer(method.lower(), template, answer.status_code, content_type, answer.content))
        return answer.json() if answer.content else None


def strict(node: Any) -> Any:
    """``node`` with ``additionalProperties: false`` on every object schema that names its properties and says
    nothing of others: an answer's member the document does not name fails validation."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def mismatches(spec: dict[str, Any], answers: list[Answer]) -> list[str]:
    """Each answer whose status, content type or body the document does not declare for its operation."""
    components = strict(copy.deepcopy(spec["components"]))
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    assert not checker.conforms("yesterday", "date-time"), "date-time unchecked: rfc3339-validator is missing"
    found = []
    for a in answers:
        where = f"{a.method.upper()} {a.path} -> {a.status}"
        declared = spec["paths"][a.path][a.method]["responses"].get(str(a.status))
        if declared is None:
            found.append(f"{where}: status not in the document")
            continue
        if a.status == 204:
            if a.body:
                found.append(f"{where}: a body on a 204")
            continue
        media = declared.get("content", {}).get(a.content_type)
        if media is None:
            found.append(f"{where}: content type {a.content_type} not in {sorted(declared.get('content', {}))}")
            continue
        schema = {**media["schema"], "components": components}
        validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
        for error in validator.iter_errors(orjson.loads(a.body)):
            found.append(f"{where}: at {'/'.join(map(str, error.absolute_path)) or 'the root'}: {error.message}")
    return found


async def exercise(r: Recorder) -> None:
    """Give every route each answer it has."""
    done = await exercise_tasks(r)
    await exercise_queues(r, done["failed"])
    await exercise_schedules_and_keys(r)
    await exercise_workflows(r)
    await exercise_limits(r)
    await r.call("DELETE", "/api/v1/tasks/{task_id}", 204, task_id=done["ok"], reason="contract")
    await r.call("DELETE", "/api/v1/tasks/{task_id}", 422, task_id=done["ok"])  # no reason
    await r.call("GET", "/api/v1/audit", 200, limit=3)
    await r.call("GET", "/api/v1/audit", 200, outcome="ok", resource_type="key")
    await r.call("GET", "/healthz", 200)
    await r.call("GET", "/readyz", 200)
    await r.call("POST", "/api/v1/tasks", 400, None)  # no body: not JSON


async def exercise_tasks(r: Recorder) -> dict[str, str]:
    """Creates (with warnings, deduplicated, batches), reads, searches, cancels, retries and bulk actions;
    the ids of the completed task and the dead-lettered one."""
    ok = await r.call("POST", "/api/v1/tasks", 201, {"name": "contract.ok", "payload": {"customer": {"id": 42}}})
    failed = await r.call("POST", "/api/v1/tasks", 201, {"name": "contract.fail", "payload": {"n": 1}})
    once = {"name": "contract.idle", "dedup_key": "contract-once", "priority": 7, "tenant_id": "acme"}
    queued = await r.call("POST", "/api/v1/tasks", 201, once)
    await r.call("POST", "/api/v1/tasks", 200, once)  # deduplicated
    await r.call("POST", "/api/v1/tasks", 201, {"name": "contract.idle", "queue_name": "nobody"})  # warnings
    delayed = await r.call("POST", "/api/v1/tasks", 201, {"name": "contract.idle", "delay_seconds": 3600})
    batch = {"tasks": [{"name": "contract.idle"}, {"name": "contract.idle", "priority": -1}, once]}
    await r.call("POST", "/api/v1/tasks:batch", 200, batch)
    await r.call("POST", "/api/v1/tasks:batch", 422, {**batch, "atomic": True})
    for task, status in ((ok, "completed"), (failed, "failed")):
        got = await r.call("GET", "/api/v1/tasks/{task_id}", 200, task_id=task["task_id"], wait=10)
        assert got["task"]["status"] == status, got
    await r.call("GET", "/api/v1/tasks/{task_id}", 200, task_id=queued["task_id"])  # no run yet
    await r.call("GET", "/api/v1/tasks/{task_id}", 200, task_id=delayed["task_id"])  # blocked by its delay
    await r.call("GET", "/api/v1/tasks/{task_id}", 404, task_id=str(uuid.uuid4()))
    await r.call("GET", "/api/v1/tasks/{task_id}", 422, task_id="not-a-uuid")
    await r.call("GET", "/api/v1/tasks/{task_id}/runs", 200, task_id=failed["task_id"])  # with its traceback
    await r.call("GET", "/api/v1/tasks/{task_id}/runs", 200, task_id=ok["task_id"])
    await r.call("GET", "/api/v1/tasks", 200, limit=2)
    await r.call("GET", "/api/v1/tasks", 200, queue=WORK_QUEUE, status="completed,failed", order="asc")
    await r.call("GET", "/api/v1/tasks", 200, error="REFUSED")
    await r.call("GET", "/api/v1/tasks", 422, limit=0)

    await exercise_cancels(r, ok["task_id"], queued["task_id"])
    return {"ok": ok["task_id"], "failed": failed["task_id"]}


async def exercise_cancels(r: Recorder, finished: str, queued: str) -> None:
    """A running and a queued cancel, a finished one refused; a retry; bulk actions and their operation."""
    slow = await r.call("POST", "/api/v1/tasks", 201, {"name": "contract.slow"})

    async def running() -> bool:
        answer = await r.client.get(f"/api/v1/tasks/{slow['task_id']}", headers=r.headers)
        return bool(answer.json()["task"]["status"] == "running")

    await wait_for(running)
    await r.call("GET", "/api/v1/tasks/{task_id}", 200, task_id=slow["task_id"])  # a running run
    await r.call("POST", "/api/v1/tasks/{task_id}/cancel", 202, task_id=slow["task_id"])
    await r.call("POST", "/api/v1/tasks/{task_id}/cancel", 200, task_id=queued)
    await r.call("POST", "/api/v1/tasks/{task_id}/cancel", 409, task_id=finished)
    await r.call("POST", "/api/v1/tasks/{task_id}/retry", 200, {"priority": 3}, task_id=queued)
    await r.call("POST", "/api/v1/tasks/{task_id}/retry", 409, task_id=finished)
    bulk = {"filter": {"queue": "nobody"}, "action": "cancel", "reason": "contract"}
    await r.call("POST", "/api/v1/tasks:bulk", 200, {**bulk, "dry_run": True})
    operation = await r.call("POST", "/api/v1/tasks:bulk", 202, bulk)
    await r.call("GET", "/api/v1/operations/{operation_id}", 200, operation_id=operation["operation_id"])
    await r.call("GET", "/api/v1/operations/{operation_id}", 404, operation_id=str(uuid.uuid4()))


async def exercise_workflows(r: Recorder) -> None:
    """Workflows submitted (deduplicated, refused), read, listed, cancelled, retried."""
    chain = {
        "name": "contract.chain",
        "dedup_key": "contract-chain",
        "nodes": [
            {"id": "a", "task": "contract.ok"},
            {"id": "fan", "task": "contract.ok", "deps": ["a"], "map": [1, 2]},
            {"id": "join", "task": "contract.ok", "deps": ["fan"]},
        ],
        "finally": {"task": "contract.ok"},
    }
    done = await r.call("POST", "/api/v1/workflows", 201, chain)
    await r.call("POST", "/api/v1/workflows", 200, chain)  # deduplicated
    cycle = {"name": "contract.cycle", "nodes": [{"id": "a", "task": "contract.ok", "deps": ["a"]}]}
    await r.call("POST", "/api/v1/workflows", 422, cycle)
    batch = {"workflows": [{**chain, "dedup_key": "contract-batch"}, chain, cycle]}
    await r.call("POST", "/api/v1/workflows:batch", 200, batch)  # created, deduplicated, rejected
    await r.call("POST", "/api/v1/workflows:batch", 422, {**batch, "atomic": True})
    failing = await r.call(
        "POST", "/api/v1/workflows", 201, {"name": "contract.fails", "nodes": [{"id": "x", "task": "contract.fail"}]}
    )
    slow = await r.call(
        "POST", "/api/v1/workflows", 201, {"name": "contract.slow", "nodes": [{"id": "s", "task": "contract.slow"}]}
    )

    async def over(workflow_id: str) -> bool:
        answer = await r.client.get(f"/api/v1/workflows/{workflow_id}", headers=r.headers)
        return answer.json()["finished_at"] is not None

    await wait_for(lambda: over(done["workflow_id"]))
    await wait_for(lambda: over(failing["workflow_id"]))
    await r.call("GET", "/api/v1/workflows/{workflow_id}", 200, workflow_id=done["workflow_id"])
    await r.call("GET", "/api/v1/workflows/{workflow_id}", 404, workflow_id=str(uuid.uuid4()))
    await r.call("GET", "/api/v1/workflows/{workflow_id}", 422, workflow_id="not-a-uuid")
    await r.call("GET", "/api/v1/workflows", 200, limit=2)
    await r.call("GET", "/api/v1/workflows", 200, status="failed", name="contract.fails")
    await r.call("GET", "/api/v1/workflows", 422, status="lost")
    await r.call(
        "POST", "/api/v1/workflows/{workflow_id}/cancel", 200, {"reason": "contract"}, workflow_id=slow["workflow_id"]
    )
    await r.call("POST", "/api/v1/workflows/{workflow_id}/cancel", 409, workflow_id=done["workflow_id"])
    await r.call("POST", "/api/v1/workflows/{workflow_id}/retry", 200, workflow_id=failing["workflow_id"])
    await r.call("POST", "/api/v1/workflows/{workflow_id}/retry", 409, workflow_id=done["workflow_id"])


async def exercise_limits(r: Recorder) -> None:
    """The limits listed and read while a run holds a slot and a task waits for it, one set at run time and
    unset, a bad body and a bad name refused, an unknown limit and an unset one never set not found."""
    held = [await r.call("POST", "/api/v1/tasks", 201, {"name": "contract.slow"}) for _ in range(2)]

    async def parked() -> bool:
        answer = await r.client.get(f"/api/v1/tasks/{held[1]['task_id']}", headers=r.headers)
        return bool(answer.json()["task"]["blocked_by"])

    await wait_for(parked)
    await r.call("GET", "/api/v1/tasks/{task_id}", 200, task_id=held[1]["task_id"])  # blocked by the limit
    listed = await r.call("GET", "/api/v1/limits", 200)
    assert [u["in_use"] for u in listed["limits"][0]["usage"]] == [1], listed
    await r.call("GET", "/api/v1/limits/{limit}", 200, limit=LIMIT)
    await r.call("GET", "/api/v1/limits/{limit}", 404, limit="none-such")
    await r.call("GET", "/api/v1/limits/{limit}", 422, limit="Not_A_Name")
    runtime = {"queue": WORK_QUEUE, "task": "contract.ok", "rate": "600/m", "burst": 5}
    await r.call("PUT", "/api/v1/limits/{limit}", 200, runtime, limit="contract-runtime")
    await r.call("PUT", "/api/v1/limits/{limit}", 200, {"key": "payload.customer.id", "concurrency": 9}, limit=LIMIT)
    await r.call("GET", "/api/v1/limits", 200)  # a configured limit overridden, one set at run time
    await r.call("PUT", "/api/v1/limits/{limit}", 422, {"concurrency": 0}, limit="contract-runtime")
    await r.call("PUT", "/api/v1/limits/{limit}", 400, None, limit="contract-runtime")  # no body: not JSON
    await r.call("DELETE", "/api/v1/limits/{limit}", 204, limit="contract-runtime")
    await r.call("DELETE", "/api/v1/limits/{limit}", 204, limit=LIMIT)  # the configured one holds again
    await r.call("DELETE", "/api/v1/limits/{limit}", 404, limit="contract-runtime")
    await r.call("DELETE", "/api/v1/limits/{limit}", 422, limit="-bad")
    for task in held:
        await r.client.post(f"/api/v1/tasks/{task['task_id']}/cancel", headers=r.headers)


async def exercise_queues(r: Recorder, failed: str) -> None:
    """Queues paused and resumed, their overviews, the workers, dead letters replayed, the history."""
    await r.call("POST", "/api/v1/queues/{queue}/pause", 200, {"reason": "contract"}, queue="default")
    await r.call("GET", "/api/v1/queues", 200)
    await r.call("GET", "/api/v1/queues/{queue}", 200, queue=WORK_QUEUE)
    await r.call("GET", "/api/v1/workers", 200)  # with a paused queue and an unserved one
    await r.call("POST", "/api/v1/queues/{queue}/resume", 200, queue="default")
    await r.call("GET", "/api/v1/queues/{queue}/dlq", 200, queue=WORK_QUEUE)
    replay = {"ids": [failed, str(uuid.uuid4())]}
    await r.call("POST", "/api/v1/queues/{queue}/dlq/replay", 200, replay, queue=WORK_QUEUE)
    await r.call("POST", "/api/v1/queues/{queue}/dlq/replay", 200, {"count": 2}, queue=WORK_QUEUE)
    await r.call("GET", "/api/v1/history", 200)
    await r.call("GET", "/api/v1/history", 200, window="day", queue=WORK_QUEUE)


async def exercise_schedules_and_keys(r: Recorder) -> None:
    """A schedule read, fired twice with one key, paused and resumed; keys made, rotated and revoked."""
    name = str(SCHEDULE["name"])
    await r.call("GET", "/api/v1/schedules", 200)
    await r.call("GET", "/api/v1/schedules/{name}", 200, name=name)
    await r.call("GET", "/api/v1/schedules/{name}", 404, name="none-such")
    await r.call("POST", "/api/v1/schedules/{name}/trigger", 201, {"idempotency_key": "k1"}, name=name)
    await r.call("POST", "/api/v1/schedules/{name}/trigger", 200, {"idempotency_key": "k1"}, name=name)
    await r.call("POST", "/api/v1/schedules/{name}/pause", 200, name=name)
    await r.call("GET", "/api/v1/schedules/{name}", 200, name=name)
    await r.call("POST", "/api/v1/schedules/{name}/resume", 200, name=name)

    await r.call("GET", "/api/v1/keys", 200)
    made = await r.call("POST", "/api/v1/keys", 201, {"name": "c", "role": "viewer", "rate_limits": {"read": 5.0}})
    rotated = await r.call("POST", "/api/v1/keys/{key_id}/rotate", 201, {"overlap_seconds": 60}, key_id=made["key_id"])
    await r.call("POST", "/api/v1/keys/{key_id}/revoke", 200, key_id=rotated["key_id"])
    await r.call("POST", "/api/v1/keys/{key_id}/revoke", 404, key_id="a" * 16)
    await r.call("GET", "/api/v1/keys", 200)  # active, revoked and a rotated key ending


async def test_every_answer_of_a_live_instance_is_one_the_document_declares(
    start_instance: Any, stores: Any, registry: Registry
) -> None:
    release = anyio.Event()
    register_handlers(registry, release)
    admin = (await api_keys.create(stores.pg, "contract-admin", list(SCOPES))).key
    settings = {"queue_names": [WORK_QUEUE], "worker_concurrency": 2, "schedules": [SCHEDULE], "limits": LIMITS}
    async with start_instance(**settings) as inst, http(inst) as client:
        try:
            recorder = Recorder(client, admin)
            await exercise(recorder)
            spec = (await client.get("/openapi.json")).json()
        finally:
            release.set()
    called = {(a.method, a.path) for a in recorder.answers}
    declared = {(m, p) for p, ops in spec["paths"].items() for m in ops if p != "/metrics"}
    assert declared - called == set(), "operations the test does not call"
    problems = mismatches(spec, recorder.answers)
    assert not problems, "\n".join(problems)


def generate_client(spec: dict[str, Any], into: Path) -> Path:
    """Generate the ``taskmesh_api_client`` package from ``spec`` under ``into``; its directory."""
    assert GENERATOR.exists(), f"{GENERATOR} is missing: `make install` installs openapi-python-client there"
    (into / "openapi.json").write_bytes(orjson.dumps(spec))
    (into / "config.yaml").write_text("package_name_override: taskmesh_api_client\npost_hooks: []\n")
    package = into / "taskmesh_api_client"
    command = [str(GENERATOR), "generate", "--path", str(into / "openapi.json"), "--config", str(into / "config.yaml")]
    done = subprocess.run(
        [*command, "--output-path", str(package), "--meta", "none"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and package.is_dir(), done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr  # a schema it could not read
    return package


def model_classes(package: Path) -> list[str]:
    """The names of the classes the generated client's ``models`` defines."""
    return [
        line.split()[1].split("(")[0].rstrip(":")
        for source in (package / "models").glob("*.py")
        for line in source.read_text().splitlines()
        if line.startswith("class ")
    ]


async def test_a_client_generated_from_the_document_creates_gets_searches_and_cancels(
    start_instance: Any, stores: Any, registry: Registry, tmp_path: Path
) -> None:
    release = anyio.Event()
    register_handlers(registry, release)
    key = (await api_keys.create(stores.pg, "contract-client", list(SCOPES))).key
    async with start_instance(queue_names=[WORK_QUEUE]) as inst, http(inst) as raw:
        spec = (await raw.get("/openapi.json")).json()
        package = await anyio.to_thread.run_sync(generate_client, spec, tmp_path)
        names = model_classes(package)
        assert {"Task", "TaskSummary", "Run", "TaskWithLatestRun", "TaskPage", "Problem", "Queue"} <= set(names)
        assert len(names) < MODEL_CLASSES_MOST, sorted(names)
        assert not [n for n in names if "V1" in n or n.endswith(("Get", "Post", "Delete")) or "Response" in n]
        sys.path.insert(0, str(tmp_path))
        try:
            await drive(importlib.import_module("taskmesh_api_client"), f"http://127.0.0.1:{inst.port}", key)
        finally:
            release.set()
            sys.path.remove(str(tmp_path))
            for name in [m for m in sys.modules if m.split(".")[0] == "taskmesh_api_client"]:
                del sys.modules[name]


async def drive(api: Any, base_url: str, key: str) -> None:
    """Create, get, search and cancel a task, and read a problem, through the generated client ``api``."""
    tasks = importlib.import_module("taskmesh_api_client.api.tasks")
    models = importlib.import_module("taskmesh_api_client.models")
    for name in ("create_task", "get_task", "search_tasks", "cancel_task"):
        importlib.import_module(f"taskmesh_api_client.api.tasks.{name}")
    async with api.AuthenticatedClient(base_url=base_url, token=key) as client:
        spec = models.TaskSpec(name="contract.slow", payload={"customer": {"id": 42}}, priority=5)
        created = await tasks.create_task.asyncio_detailed(client=client, body=spec)
        assert created.status_code == 201 and isinstance(created.parsed, models.TaskCreated), created.content
        task_id = created.parsed.task_id
        assert isinstance(task_id, uuid.UUID)
        first = await tasks.get_task.asyncio(task_id, client=client)
        assert first.task.queue_name == WORK_QUEUE  # the handler's queue: the client sent none

        async def running() -> Any:
            got = await tasks.get_task.asyncio(task_id, client=client)
            return got if got.task.status == models.TaskStatus.RUNNING else None

        got = await wait_for(running)
        assert isinstance(got, models.TaskWithLatestRun) and isinstance(got.task, models.Task)
        assert got.task.payload == {"customer": {"id": 42}} and got.task.priority == 5
        assert isinstance(got.latest_run, models.Run) and got.latest_run.status == models.RunStatus.RUNNING

        page = await tasks.search_tasks.asyncio(client=client, queue=WORK_QUEUE, status=[models.TaskStatus.RUNNING])
        assert isinstance(page, models.TaskPage) and page.next_cursor is None
        assert [t.id for t in page.tasks] == [task_id] and isinstance(page.tasks[0], models.TaskSummary)

        cancelled = await tasks.cancel_task.asyncio_detailed(task_id, client=client)
        assert cancelled.status_code == 202 and isinstance(cancelled.parsed, models.Cancellation), cancelled.content
        assert cancelled.parsed.cancel_requested is True

        async def ended() -> Any:
            got = await tasks.get_task.asyncio(task_id, client=client)
            return got if got.task.status == models.TaskStatus.CANCELLED else None

        await wait_for(ended)
        missing = await tasks.get_task.asyncio_detailed(uuid.uuid4(), client=client)
        assert missing.status_code == 404 and isinstance(missing.parsed, models.Problem), missing.content
        assert missing.parsed.title == "Task not found"
