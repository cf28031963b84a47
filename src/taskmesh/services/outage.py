"""Shared behaviour of services when a store fails: log once per outage, back off."""

from __future__ import annotations

import anyio
import asyncpg
import redis.exceptions
import structlog

from taskmesh.metrics import current_metrics

STORE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    redis.exceptions.RedisError,
    TimeoutError,
)
"""What a store failure looks like from asyncpg and redis-py."""


class Outage:
    """Tracks one service's view of a store outage.

    ``failed()`` counts the failure in ``taskmesh_store_errors_total`` (of the
    instance running this task, see ``metrics.current_metrics``), logs
    ``store_unavailable`` on the first failure of an outage
    and sleeps with exponential backoff (0.1 s doubling to ``max_delay``);
    ``recovered()`` logs ``store_recovered`` once when a call succeeds again.
    """

    def __init__(self, service: str, max_delay: float = 5.0) -> None:
        self.service = service
        self.max_delay = max_delay
        self.failures = 0
        self.log = structlog.get_logger(f"taskmesh.{service}")

    async def failed(self, exc: BaseException) -> None:
        metrics = current_metrics.get()
        if metrics is not None:
            metrics.store_failed(exc)
        if self.failures == 0:
            self.log.warning("store_unavailable", service=self.service, error=f"{type(exc).__name__}: {exc}")
        self.failures += 1
        await anyio.sleep(min(0.1 * 2 ** min(self.failures - 1, 10), self.max_delay))

    def recovered(self) -> None:
        if self.failures:
            self.log.info("store_recovered", service=self.service, failures=self.failures)
            self.failures = 0
