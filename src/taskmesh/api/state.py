"""What the HTTP layer reads from its instance: the facades once the stores are up, readiness flags."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from taskmesh.api.denials import Denials
from taskmesh.api.principals import KeyCache, RatePolicy
from taskmesh.api.quotas import Quotas
from taskmesh.observability.log_throttle import ThrottledLog
from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import Metrics
from taskmesh.runtime.clock import Waker
from taskmesh.schedules.schedules import Schedules
from taskmesh.services.finished_feed import FinishedWaiters
from taskmesh.services.supervision import ServiceStates
from taskmesh.store import PgStore, Stores
from taskmesh.store.schema_watch import SchemaWatch
from taskmesh.tasks.tasks import Tasks
from taskmesh.workflows.workflows import Workflows

SERVED_CACHE_SECONDS = 5.0
"""How long creates trust the last read of which queues live workers serve."""
SERVED_QUEUES_READ = 10_000
"""Most served queues read (more than any deployment has)."""


@dataclass
class ServedQueues:
    """The queues live (running or draining) workers serve and the task names they have handlers
    for, read at most every ``ttl`` seconds.

    Creates ask it whether their queue is served and their name handled there, so it must stay
    cheap: one read of the ``workers`` table per ``ttl`` however many creates, while other creates
    keep the last answer. Before the first read completes every
    caller reads.

    :param own: the queues this instance serves itself (its ``queue_names`` when its workers are
        on): served whatever the table says (before its first heartbeat, or after a stale read).
    :param own_names: the task names this instance has handlers for; ``None``: any (a fallback).
    :param ttl: seconds a read is trusted.
    """

    own: frozenset[str] = frozenset()
    own_names: frozenset[str] | None = None
    ttl: float = SERVED_CACHE_SECONDS
    _handlers: dict[str, frozenset[str] | None] = field(default_factory=dict)
    _read_at: float | None = None
    _reading: bool = False

    async def get(self, pg: PgStore) -> dict[str, frozenset[str] | None]:
        """``{served queue: the task names handled there, None for any}``, read again when older than ``ttl``.

        :raises StoreError: PostgreSQL failed (the next call reads again).
        """
        stale = self._read_at is None or time.monotonic() - self._read_at >= self.ttl
        if self._read_at is None or (stale and not self._reading):
            self._reading = True
            try:
                self._handlers = await pg.workers.served_handlers(SERVED_QUEUES_READ)
                self._read_at = time.monotonic()
            finally:
                self._reading = False
        served = dict(self._handlers)
        for queue in self.own:
            theirs = served.get(queue, frozenset())
            served[queue] = None if theirs is None or self.own_names is None else theirs | self.own_names
        return served


@dataclass
class AppState:
    """Shared between the supervisor (which fills it) and the routes (which read it).

    ``stores``, ``tasks`` and ``schedules`` are ``None`` until the stores answered
    and again once the instance stops; routes then answer 503.
    """

    metrics: Metrics
    queues: list[str]
    served: ServedQueues = field(default_factory=ServedQueues)
    keys: KeyCache = field(default_factory=KeyCache)
    """API keys as last read, and whether the instance runs open."""
    rate_policies: dict[str, RatePolicy] = field(default_factory=dict)
    """Per-key rate limits by class (``read``, ``write``, ``admin``); empty: none."""
    rate_burst_seconds: float = 2.0
    """A key's own rates (its ``rate_limits``) allow bursts of this many seconds of them."""
    rate_unchecked: ThrottledLog = field(
        default_factory=lambda: ThrottledLog(get_logger("taskmesh.auth"), "rate_limit_unchecked")
    )
    """Requests let through unlimited while Redis does not answer: one line per 10 s with their count."""
    auth_refusals: RatePolicy | None = None
    """Refused authentications a client address may have (``auth_refusals_per_minute``); ``None``: no limit."""
    refusals_unchecked: ThrottledLog = field(
        default_factory=lambda: ThrottledLog(get_logger("taskmesh.auth"), "auth_refusals_unchecked")
    )
    """Refusals not counted while Redis does not answer: one line per 10 s with their count."""
    denials: Denials = field(default_factory=Denials)
    """Refused requests counted for the audit log, so that a flood writes a bounded number of rows."""
    quotas: Quotas = field(default_factory=Quotas)
    """Tenants' quotas."""
    metrics_protected: bool = False
    """``/metrics`` needs ``metrics:read`` (``metrics_auth = "scope"``)."""
    console_session_seconds: float = 8 * 3600.0
    """How long a console session lasts after sign-in (``console_session_hours``)."""
    waiters: FinishedWaiters = field(default_factory=FinishedWaiters)
    startup: dict[str, str] = field(default_factory=lambda: {"postgres": "connecting", "redis": "connecting"})
    """Each store's state while the instance starts (``connecting``, ``down``, ``ok``), for ``/readyz``."""
    schema: SchemaWatch = field(default_factory=SchemaWatch)
    """The statements PostgreSQL refused against its schema, for ``/readyz`` (the instance's store records them)."""
    stores: Stores | None = None
    tasks: Tasks | None = None
    schedules: Schedules | None = None
    workflows: Workflows | None = None
    schedule_waker: Waker = field(default_factory=Waker)
    services: ServiceStates = field(default_factory=ServiceStates)
    draining: bool = False
