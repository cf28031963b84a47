"""What the HTTP layer reads from its instance: the facades once the stores are up, readiness flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from taskmesh.clock import Waker
from taskmesh.metrics import Metrics
from taskmesh.schedules import Schedules
from taskmesh.services.supervision import ServiceStates
from taskmesh.store import Stores
from taskmesh.tasks import Tasks


@dataclass
class AppState:
    """Shared between the supervisor (which fills it) and the routes (which read it).

    ``stores``, ``tasks`` and ``schedules`` are ``None`` until the stores answered
    and again once the instance stops; routes then answer 503.
    """

    metrics: Metrics
    queues: list[str]
    stores: Stores | None = None
    tasks: Tasks | None = None
    schedules: Schedules | None = None
    schedule_waker: Waker = field(default_factory=Waker)
    services: ServiceStates = field(default_factory=ServiceStates)
    draining: bool = False
