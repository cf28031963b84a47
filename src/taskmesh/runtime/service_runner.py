"""The service table's rows and what runs them: each under the crash policy, stopped phase by phase.

A row is a service (:class:`~taskmesh.services.supervision.ServiceSpec`) and its stop phase. The
phases are stopped in :class:`StopPhase`'s order, one after the other: every row of a phase is told
to stop, and the next phase begins once all of them have ended. Each row's start and end
are logged (``service_started``, ``service_stopped``: service, phase, worker_id) and its end is
recorded in the order it came, for tests and operators.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import Metrics
from taskmesh.services.supervision import RestartBudget, ServiceSpec, ServiceStates, supervise

log = get_logger("taskmesh.runtime.supervisor")


class StopPhase(enum.IntEnum):
    """When a service stops at shutdown; the phases stop in this order, each once the one before has ended."""

    FIRES = 1
    """The scheduler: a draining instance makes no new fires."""
    INTAKE = 2
    """The fetchers claim nothing more, and the worker processes are told to drain (in the same grace)."""
    RESULTS = 3
    """Once the executors finished or handed back what they held: the committer writes every result."""
    UPKEEP = 4
    """The heartbeat (it kept the leases until the results were written) and the maintenance services."""


def _cancel(scope: anyio.CancelScope) -> None:
    scope.cancel()


@dataclass(frozen=True)
class Row:
    """One row of the service table.

    :param spec: the service (its name, how it runs, whether it is critical).
    :param phase: when it stops at shutdown.
    :param stop: how it is told to stop, given its cancel scope: by default the scope is cancelled;
        a service that ends by itself (a fetcher on its stop event, the committer once closed) says so.
    :param ended: called once the service has ended for good (a fetcher's executors then drain).
    :param graced: it runs under the grace period with the executors: cancelled when the grace ends
        (or at once on a second signal), should it not have ended by itself before.
    """

    spec: ServiceSpec
    phase: StopPhase
    stop: Callable[[anyio.CancelScope], None] = _cancel
    ended: Callable[[], None] | None = None
    graced: bool = False

    @property
    def name(self) -> str:
        """The service's name (``fetcher:default``)."""
        return self.spec.name


@dataclass
class _Running:
    row: Row
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass
class ServiceRunner:
    """Starts rows under the crash policy and stops them in :class:`StopPhase` order.

    :param worker_id: the instance's, on its ``service_started`` and ``service_stopped`` lines.
    :param states: the services' states (``/readyz``, ``taskmesh_service_up``).
    :param budget, metrics, on_fatal: the crash policy's (:func:`~taskmesh.services.supervision.supervise`).
    """

    worker_id: str
    states: ServiceStates
    budget: RestartBudget
    metrics: Metrics | None
    on_fatal: Callable[[str, int], None]
    rows: list[Row] = field(default_factory=list)
    """Every row started, in start order."""
    stopped: list[str] = field(default_factory=list)
    """The names of the rows that ended, in the order they did."""
    _running: list[_Running] = field(default_factory=list)

    def start(self, group: TaskGroup, row: Row) -> None:
        """Run ``row`` in ``group`` until it is stopped (or gives up past its restart budget)."""
        running = _Running(row)
        self.rows.append(row)
        self._running.append(running)
        log.info("service_started", service=row.name, phase=row.phase.name.lower(), worker_id=self.worker_id)

        async def go() -> None:
            try:
                with running.scope:
                    await supervise(
                        row.spec, self.states, budget=self.budget, metrics=self.metrics, on_fatal=self.on_fatal
                    )
            finally:
                running.done.set()
                self.stopped.append(row.name)
                log.info("service_stopped", service=row.name, phase=row.phase.name.lower(), worker_id=self.worker_id)
                if row.ended is not None:
                    row.ended()

        group.start_soon(go)

    async def stop(self, phase: StopPhase) -> None:
        """Tell every running row of ``phase`` to stop, and return once all of them have ended."""
        rows = [r for r in self._running if r.row.phase is phase and not r.done.is_set()]
        for running in rows:
            running.row.stop(running.scope)
        for running in rows:
            await running.done.wait()

    async def stop_all(self, after: Mapping[StopPhase, Callable[[], Awaitable[None]]] | None = None) -> None:
        """Stop every phase in order; ``after[phase]`` runs once ``phase`` has stopped (the drain, the hand-back)."""
        for phase in StopPhase:
            await self.stop(phase)
            if after and phase in after:
                await after[phase]()
