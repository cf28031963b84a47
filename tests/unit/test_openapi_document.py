"""The OpenAPI document's shape as a contract: valid, stable operation ids and tags, shared schemas.

Built from the app without stores (nothing here answers a request). What the answers hold is checked
against a live instance in ``tests/integration/test_openapi_contract.py``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from openapi_spec_validator import validate

from taskmesh.api.app import create_app
from taskmesh.api.contract import TAGS
from taskmesh.api.state import AppState
from taskmesh.observability.metrics import Metrics

OPERATIONS = {
    "POST /api/v1/tasks": ("createTask", "tasks"),
    "GET /api/v1/tasks": ("searchTasks", "tasks"),
    "POST /api/v1/workflows": ("createWorkflow", "workflows"),
    "POST /api/v1/workflows:batch": ("createWorkflowBatch", "workflows"),
    "GET /api/v1/workflows": ("listWorkflows", "workflows"),
    "GET /api/v1/workflows/{workflow_id}": ("getWorkflow", "workflows"),
    "POST /api/v1/workflows/{workflow_id}/cancel": ("cancelWorkflow", "workflows"),
    "POST /api/v1/workflows/{workflow_id}/retry": ("retryWorkflow", "workflows"),
    "POST /api/v1/tasks:batch": ("createTaskBatch", "tasks"),
    "GET /api/v1/tasks/{task_id}": ("getTask", "tasks"),
    "DELETE /api/v1/tasks/{task_id}": ("deleteTask", "tasks"),
    "POST /api/v1/tasks/{task_id}/cancel": ("cancelTask", "tasks"),
    "POST /api/v1/tasks/{task_id}/retry": ("retryTask", "tasks"),
    "GET /api/v1/tasks/{task_id}/runs": ("listTaskRuns", "runs"),
    "POST /api/v1/tasks:bulk": ("bulkTasks", "operations"),
    "GET /api/v1/operations/{operation_id}": ("getOperation", "operations"),
    "GET /api/v1/queues": ("listQueues", "queues"),
    "GET /api/v1/queues/{queue}": ("getQueue", "queues"),
    "POST /api/v1/queues/{queue}/pause": ("pauseQueue", "queues"),
    "POST /api/v1/queues/{queue}/resume": ("resumeQueue", "queues"),
    "GET /api/v1/history": ("getHistory", "queues"),
    "GET /api/v1/queues/{queue}/dlq": ("listDeadLetters", "dlq"),
    "POST /api/v1/queues/{queue}/dlq/replay": ("replayDeadLetters", "dlq"),
    "GET /api/v1/limits": ("listLimits", "limits"),
    "GET /api/v1/limits/{limit}": ("getLimit", "limits"),
    "PUT /api/v1/limits/{limit}": ("setLimit", "limits"),
    "DELETE /api/v1/limits/{limit}": ("unsetLimit", "limits"),
    "GET /api/v1/schedules": ("listSchedules", "schedules"),
    "GET /api/v1/schedules/{name}": ("getSchedule", "schedules"),
    "POST /api/v1/schedules/{name}/trigger": ("triggerSchedule", "schedules"),
    "POST /api/v1/schedules/{name}/pause": ("pauseSchedule", "schedules"),
    "POST /api/v1/schedules/{name}/resume": ("resumeSchedule", "schedules"),
    "GET /api/v1/workers": ("listWorkers", "workers"),
    "GET /api/v1/keys": ("listKeys", "keys"),
    "POST /api/v1/keys": ("createKey", "keys"),
    "POST /api/v1/keys/{key_id}/revoke": ("revokeKey", "keys"),
    "POST /api/v1/keys/{key_id}/rotate": ("rotateKey", "keys"),
    "GET /api/v1/audit": ("listAuditEvents", "audit"),
    "GET /healthz": ("getLiveness", "health"),
    "GET /readyz": ("getReadiness", "health"),
    "GET /metrics": ("getMetrics", "health"),
}
"""Every operation's id and tag: a generated client's method names and modules, which must not change."""
PROBLEM = {"$ref": "#/components/schemas/Problem"}
SHARED_SCHEMAS = {"Task", "TaskSummary", "Run", "Queue", "Schedule", "Key", "Problem", "TaskPage", "AuditPage", "Limit"}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    app = create_app(AppState(metrics=Metrics(), queues=["default"]), console_enabled=True)
    document: dict[str, Any] = app.openapi()
    return document


def operations(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{m.upper()} {p}": op for p, ops in spec["paths"].items() for m, op in ops.items()}


def test_the_document_is_valid_openapi(spec: dict[str, Any]) -> None:
    validate(spec)


def test_every_operation_has_its_stable_camel_case_id_and_one_tag_of_its_resource(spec: dict[str, Any]) -> None:
    found = {where: (op.get("operationId"), *op.get("tags", [])) for where, op in operations(spec).items()}
    assert found == OPERATIONS
    assert all(re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)*", op_id) for op_id, _ in OPERATIONS.values())
    assert {tag for _, tag in OPERATIONS.values()} == {t["name"] for t in spec["tags"]} == {t["name"] for t in TAGS}


def test_the_console_is_not_in_the_document(spec: dict[str, Any]) -> None:
    assert not [path for path in spec["paths"] if not path.startswith(("/api/v1/", "/healthz", "/readyz", "/metrics"))]


def test_every_error_is_the_shared_problem_and_every_answer_with_a_body_a_shared_schema(spec: dict[str, Any]) -> None:
    untyped = []
    for where, op in operations(spec).items():
        for status, response in op["responses"].items():
            content = response.get("content", {})
            if (where, status) == ("GET /readyz", "503"):  # not ready: the readiness body, naming what is down
                if content != {"application/json": {"schema": {"$ref": "#/components/schemas/Readiness"}}}:
                    untyped.append(f"{where} {status}: {content}")
            elif int(status) >= 400:
                if content != {"application/problem+json": {"schema": PROBLEM}}:
                    untyped.append(f"{where} {status}: {content}")
            elif status != "204" and where != "GET /metrics":
                schema = content.get("application/json", {}).get("schema", {})
                if set(content) != {"application/json"} or not schema.get("$ref", "").startswith("#/components/"):
                    untyped.append(f"{where} {status}: {content}")
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
        if "requestBody" in op and not body.get("$ref", "").startswith("#/components/schemas/"):
            untyped.append(f"{where} body: {body}")
    assert not untyped, "\n".join(untyped)
    assert SHARED_SCHEMAS <= set(spec["components"]["schemas"])
