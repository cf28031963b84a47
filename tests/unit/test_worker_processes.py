"""What a worker process is given: the primary's settings, worker-only, on the ports after the primary's."""

from __future__ import annotations

import os

import pytest

from taskmesh.config import load_settings
from taskmesh.runtime.worker_processes import child_environment, child_port, child_settings, describe_exit


def test_a_child_gets_the_primarys_settings_worker_only_on_the_next_ports() -> None:
    settings = load_settings(
        database_url="postgresql://app:secret@db/app",
        redis_url="redis://cache:6379/0",
        http_port=8080,
        metrics_port=9090,
        worker_processes=3,
        queue_names=["default", "reports"],
        worker_concurrency=16,
        handlers=["myapp.tasks"],
        queues={"reports": {"concurrency": 2, "prefetch": 4}},
        schedules=[{"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris", "task": "reports.nightly"}],
        tenant_quotas={"acme": {"max_queued": 1000}},
    )
    child = load_settings(**child_settings(settings, 2))
    assert (child.http_port, child.metrics_port) == (8082, 9092)
    assert (child.worker_processes, child.api_enabled, child.scheduler_enabled) == (1, False, False)
    assert child.workers_enabled
    same = (
        "database_url",
        "redis_url",
        "queue_names",
        "worker_concurrency",
        "handlers",
        "lease_seconds",
        "queues",
        "schedules",
        "tenant_quotas",
    )
    assert {k: getattr(child, k) for k in same} == {k: getattr(settings, k) for k in same}


def test_a_child_of_a_primary_on_a_free_port_takes_a_free_port_too() -> None:
    assert child_port(0, 3) == 0
    assert child_port(None, 3) is None
    assert child_port(8080, 1) == 8081


def test_the_environment_carries_the_primarys_pid_but_not_systemds_socket_nor_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SOMETHING_OF_THE_OPERATOR", "kept")
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    env = child_environment()
    assert env["SOMETHING_OF_THE_OPERATOR"] == "kept"
    assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env  # systemd hears from the primary alone
    assert env["TASKMESH_WORKER_PROCESS_PARENT"] == str(os.getpid())
    # The settings (the database's password) come on stdin: a handler's subprocess cannot read them.
    assert not [k for k in env if k.startswith("TASKMESH_WORKER_PROCESS_SETTINGS")]


@pytest.mark.parametrize(("code", "text"), [(0, "exit code 0"), (2, "exit code 2"), (-9, "signal SIGKILL")])
def test_an_exit_is_described_as_operators_read_it(code: int, text: str) -> None:
    assert describe_exit(code) == text
