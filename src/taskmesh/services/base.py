"""What every service shares: outage handling with backoff, and the loop of a periodic service.

A periodic service is a module with ``run_once(...)`` (one tick, returning a
small dict of counts, which is what tests call) and ``run(...)``, which calls
:func:`run_periodic`. The loop's failure model:

- a **transient** :class:`~taskmesh.errors.StoreError` (an outage) is logged
  once per outage (``store_unavailable``, naming the service and the store),
  counted, and retried with exponential backoff (0.1 s doubling to
  ``max_backoff``); ``store_recovered`` is logged when a tick succeeds again;
- a **non-transient** store error (a data error, a reply taskmesh did not write)
  is logged at error (``service_tick_failed``, naming the operation) and that
  tick is skipped: the next one comes after the usual interval, never in a
  tight loop;
- any other exception is a bug: it leaves the loop, and the supervisor's crash
  policy logs it with its traceback and restarts the service within a budget.

Every tick is counted in ``taskmesh_service_ticks_total{service,outcome}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import anyio

from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import current_metrics

log = get_logger("taskmesh.services")

Counts = Mapping[str, int]
"""What a tick did, e.g. ``{"moved": 12}``; empty when nothing happened."""


class Outage:
    """One service's view of a store outage: log once, count, back off.

    :param service: the service's name, in log lines.
    :param max_delay: longest backoff between attempts, seconds.
    """

    def __init__(self, service: str, max_delay: float = 5.0) -> None:
        self.service = service
        self.max_delay = max_delay
        self.failures = 0

    async def failed(self, exc: StoreError) -> None:
        """Record a transient failure: count it, log the first of an outage, sleep the backoff."""
        metrics = current_metrics.get()
        if metrics is not None:
            metrics.store_failed(exc.store)
        if self.failures == 0:
            log.warning("store_unavailable", service=self.service, store=exc.store, error=str(exc))
        self.failures += 1
        await anyio.sleep(min(0.1 * 2 ** min(self.failures - 1, 10), self.max_delay))

    def recovered(self) -> None:
        """Record a success: logs ``store_recovered`` once after an outage."""
        if self.failures:
            log.info("store_recovered", service=self.service, failures=self.failures)
            self.failures = 0


async def call_until_done(
    service: str,
    call: Callable[[], Awaitable[object]],
    *,
    max_delay: float = 5.0,
    on_failure: Callable[[StoreError], None] | None = None,
) -> None:
    """Call ``call`` until it succeeds, backing off through transient store errors.

    :param on_failure: told of each transient failure before the backoff (``/readyz``'s start-up view).
    :raises StoreError: a non-transient one (retrying cannot fix it).
    """
    outage = Outage(service, max_delay)
    while True:
        try:
            await call()
        except StoreError as exc:
            if not exc.transient:
                raise
            if on_failure is not None:
                on_failure(exc)
            await outage.failed(exc)
            continue
        outage.recovered()
        return


async def run_periodic(
    service: str,
    tick: Callable[[], Awaitable[Counts | None]],
    *,
    interval: float,
    first_delay: float = 0.0,
    max_backoff: float = 5.0,
    event: str | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
) -> None:
    """Run ``tick`` every ``interval`` seconds for ever (cancelled by the supervisor); see module docs.

    :param first_delay: seconds before the first tick.
    :param event: log this event at info with the tick's counts when they are not all zero.
    :param sleep: how to wait (tests inject a fake).
    """
    outage = Outage(service, max_backoff)
    if first_delay:
        await sleep(first_delay)
    while True:
        metrics = current_metrics.get()
        try:
            counts = await tick()
        except StoreError as exc:
            if exc.transient:
                if metrics is not None:
                    metrics.service_ticks.labels(service, "store_unavailable").inc()
                await outage.failed(exc)
                continue
            if metrics is not None:
                metrics.service_ticks.labels(service, "error").inc()
            log.error("service_tick_failed", service=service, operation=exc.operation, error=str(exc))
            await sleep(interval)
            continue
        outage.recovered()
        if metrics is not None:
            metrics.service_ticks.labels(service, "ok").inc()
        if event is not None and counts and any(counts.values()):
            log.info(event, **counts)
        await sleep(interval)
