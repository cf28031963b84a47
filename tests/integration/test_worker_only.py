"""An instance with ``http_enabled`` off (``taskmesh worker``): no port at all, its tasks run all the same;
and an app whose console extra is missing serves the API on, saying which extra the console needs."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from taskmesh import extras
from taskmesh.api.app import create_app
from taskmesh.api.state import AppState
from taskmesh.clients.client import Client
from taskmesh.console.lazy import LazyConsole
from taskmesh.errors import ConfigError
from taskmesh.observability.metrics import Metrics
from taskmesh.runtime import supervisor
from taskmesh.tasks.registry import Registry

pytestmark = pytest.mark.anyio


async def test_an_instance_without_http_listens_on_no_port_and_runs_a_clients_task(
    start_instance: Any, registry: Registry, database_url: str, redis_url: str, prefix: str
) -> None:
    @registry.task("worker_only.add")
    async def add(payload: dict[str, int]) -> int:
        return payload["a"] + payload["b"]

    async with (
        start_instance(http_enabled=False, api_enabled=False) as inst,
        Client(database_url, redis_url, redis_prefix=prefix) as client,
    ):
        assert inst.port is None and inst.metrics_port is None
        assert await client.wait(await client.enqueue("worker_only.add", {"a": 2, "b": 3}), timeout=20) == 5


async def test_a_metrics_port_without_http_is_refused_before_anything_starts(
    make_settings: Any, registry: Registry
) -> None:
    with pytest.raises(ConfigError, match="metrics_port: set, but http_enabled is off"):
        await supervisor.run(make_settings(http_enabled=False, metrics_port=0), registry, signals=False)


def test_without_the_console_extra_the_api_serves_on_and_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(extras.MODULES, "console", ("jinja2", "taskmesh_no_such_module"))
    with structlog.testing.capture_logs() as logs:
        app = create_app(AppState(metrics=Metrics(), queues=["default"]), console_enabled=True)
    assert "/api/v1/tasks" in app.openapi()["paths"]
    assert not any(isinstance(route, LazyConsole) for route in app.router.routes)
    (event,) = [e for e in logs if e["event"] == "console_unavailable"]
    assert "pip install 'taskmesh[console]'" in event["reason"] and "taskmesh_no_such_module" in event["reason"]
