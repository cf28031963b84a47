"""An instance stops its services in the order its service table states, phase after phase.

A real ``taskmesh run`` (a schedule, a queue, the API and one worker process) against the real
stores gets SIGTERM; its log says which rows it started, in which stop phase
(``service_started``), and in which order they ended (``service_stopped``).
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from taskmesh.runtime.service_runner import StopPhase
from tests.proc import Proc, call, spawn, stores_env, wait_until

__all__ = ["spawn"]  # a fixture, used by name
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("redis_client")]

SCHEDULE = json.dumps([{"name": "tick", "cron": "*/5 * * * * *", "task": "noop"}])


def own_lines(proc: Proc, event: str) -> list[dict[str, Any]]:
    """The primary's ``event`` lines, in order (its worker process writes to the same log)."""
    return [e for e in proc.events() if e.get("event") == event and f"-{proc.pid}-" in str(e.get("worker_id"))]


def child_ready(proc: Proc, event: dict[str, Any]) -> bool:
    """Whether ``event`` is the worker process's ``instance_ready``."""
    return event.get("event") == "instance_ready" and f"-{proc.pid}-" not in str(event.get("worker_id"))


async def test_sigterm_stops_the_rows_phase_by_phase_in_the_tables_order(
    spawn: Any, database_url: str, redis_url: str, prefix: str
) -> None:
    env = stores_env(
        database_url,
        redis_url,
        prefix,
        TASKMESH_AUTH="none",
        TASKMESH_SCHEDULES=SCHEDULE,
        TASKMESH_WORKER_PROCESSES="2",
        TASKMESH_SHUTDOWN_GRACE_SECONDS="5",
    )
    proc: Proc = spawn(**env)
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, proc=proc, timeout=30)
    wait_until(lambda: any(child_ready(proc, e) for e in proc.events()), proc=proc, timeout=30)
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()

    table = {e["service"]: StopPhase[e["phase"].upper()] for e in own_lines(proc, "service_started")}
    stopped = [e["service"] for e in own_lines(proc, "service_stopped")]
    # Every row, the committer, scheduler, fetcher and worker process included, with the phase the table gives it.
    named = ("scheduler", "fetcher:default", "worker_process:1", "committer", "heartbeat")
    assert {name: table.get(name) for name in named} == {
        "scheduler": StopPhase.FIRES,
        "fetcher:default": StopPhase.INTAKE,
        "worker_process:1": StopPhase.INTAKE,
        "committer": StopPhase.RESULTS,
        "heartbeat": StopPhase.UPKEEP,
    }
    assert sorted(stopped) == sorted(table), "each row stopped once"
    # The observed order, as phases: the table's order (within a phase the rows stop together).
    observed = [table[name] for name in stopped]
    assert observed == sorted(observed), f"stopped out of phase order: {[(n, table[n].name) for n in stopped]}"
