"""The crash policy: every service runs under :func:`supervise`, which restarts it within a budget.

A service that raises an unexpected exception (a bug, a value no one planned
for) is logged at error with its traceback (``service_crashed``), counted in
``taskmesh_service_restarts_total{service}``, and restarted after a backoff
(0.5 s doubling to 10 s). More than ``restarts`` crashes within
``window_seconds`` exhaust its budget (``service_failed``): a **critical**
service then asks the instance to shut down gracefully (drain, hand back,
deregister) and exit non-zero, since the instance cannot keep its promises
without it; an **optional** one (metrics sampling, retention, cron firing,
clock sync) stays down, shown in ``/readyz`` and ``taskmesh_service_up``,
and the instance carries on. Store outages never reach this policy: services
handle them themselves (``services.base``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import Metrics
from taskmesh.tasks.storable import describe

log = get_logger("taskmesh.runtime.supervisor")

RUNNING = "running"
RESTARTING = "restarting"
FAILED = "failed"
STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """One row of the service table.

    :param name: the service's name in logs, metrics and ``/readyz`` (``fetcher:default``).
    :param run: starts the service; returns only when it is done (stopped on purpose).
    :param critical: past its restart budget the instance shuts down (else it stays down alone).
    :param gates_readiness: while a critical service restarts, ``/readyz`` answers 503. False for
        one whose absence leaves this process serving (a worker process: it is listed, not failed).
    """

    name: str
    run: Callable[[], Awaitable[None]]
    critical: bool
    gates_readiness: bool = True


@dataclass(frozen=True, slots=True)
class RestartBudget:
    """How often a service may crash: more than ``restarts`` within ``window_seconds`` exhausts it."""

    restarts: int = 5
    window_seconds: float = 60.0
    first_backoff: float = 0.5
    max_backoff: float = 10.0


@dataclass
class ServiceStates:
    """What each service of an instance is doing now: running, restarting, failed or stopped."""

    states: dict[str, str] = field(default_factory=dict)
    critical: set[str] = field(default_factory=set)

    def down(self) -> dict[str, str]:
        """Services not running (restarting or failed), by name."""
        return {n: s for n, s in self.states.items() if s in (RESTARTING, FAILED)}

    def critical_down(self) -> bool:
        """Whether a critical service is restarting or has failed."""
        return any(n in self.critical for n in self.down())


async def supervise(
    spec: ServiceSpec,
    states: ServiceStates,
    *,
    budget: RestartBudget,
    metrics: Metrics | None,
    on_fatal: Callable[[str, int], None],
) -> None:
    """Run ``spec`` under the crash policy (see module docs); returns when it ends or gives up.

    :param on_fatal: called with the service's name and crash count when a critical
        service exhausts its budget (the supervisor starts its shutdown there).
    """
    crashes: deque[float] = deque()
    if spec.critical and spec.gates_readiness:
        states.critical.add(spec.name)
    while True:
        states.states[spec.name] = RUNNING
        if metrics is not None:
            metrics.service_up.labels(spec.name).set(1)
        try:
            await spec.run()
            states.states[spec.name] = STOPPED
            return
        except Exception as exc:
            now = time.monotonic()
            crashes.append(now)
            while crashes and crashes[0] < now - budget.window_seconds:
                crashes.popleft()
            if metrics is not None:
                metrics.service_restarts.labels(spec.name).inc()
                metrics.service_up.labels(spec.name).set(0)
            log.error("service_crashed", service=spec.name, error=describe(exc), crashes=len(crashes), exc_info=True)
            if len(crashes) > budget.restarts:
                states.states[spec.name] = FAILED
                log.error(
                    "service_failed",
                    service=spec.name,
                    crashes=len(crashes),
                    window_s=budget.window_seconds,
                    critical=spec.critical,
                    action="instance shuts down" if spec.critical else "service stays down",
                )
                if spec.critical:
                    on_fatal(spec.name, len(crashes))
                return
            states.states[spec.name] = RESTARTING
            await anyio.sleep(min(budget.first_backoff * 2 ** (len(crashes) - 1), budget.max_backoff))
        finally:
            if metrics is not None and states.states.get(spec.name) != RUNNING:
                metrics.service_up.labels(spec.name).set(0)
