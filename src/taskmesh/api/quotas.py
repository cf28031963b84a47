"""Tenants' quotas: most tasks queued or running, most payload bytes, tasks per second.

Payload bytes and the rate are checked here, before a create through the API stores anything,
for each tenant the request's tasks belong to (whichever key makes them: a quota is the
tenant's, not a key's). The rate is a GCRA bucket in Redis shared by every instance, charged one
unit per task (also for a create ``max_queued`` then refuses). ``max_queued`` is held exactly, in
the transaction that stores the tasks (``taskmesh/tasks/queued_quota.py``, through
:class:`~taskmesh.tasks.tasks.Tasks`), so that concurrent creates on any number of instances never
store one task more than it allows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from taskmesh.config import TenantQuota
from taskmesh.errors import QuotaExceededError, StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.store import PgStore, RedisStore
from taskmesh.tasks.validation import TaskSpec

log = get_logger("taskmesh.quotas")


@dataclass(frozen=True)
class Quotas:
    """The quotas of the settings: per tenant, a default for the others, and the rate's burst in seconds."""

    by_tenant: dict[str, TenantQuota] = field(default_factory=dict)
    default: TenantQuota | None = None
    burst_seconds: float = 2.0

    def of(self, tenant_id: str) -> TenantQuota | None:
        """The tenant's quotas (its own, else the default; ``None``: none)."""
        return self.by_tenant.get(tenant_id, self.default)

    async def check(
        self, pg: PgStore, redis: RedisStore, specs: Sequence[TaskSpec], prefixes: Sequence[str] | None = None
    ) -> None:
        """Refuse the creates when one of their tenants' payload or rate quotas would be exceeded
        (``max_queued`` is held by the store's transaction, see the module docs).

        :param prefixes: each spec's field prefix (``tasks[3].`` in a batch; default none).
        :raises QuotaExceededError: naming the quota and tenant (413 for payload bytes, else 429).
        """
        counts = Counter(s.tenant_id for s in specs if s.tenant_id is not None)
        for tenant, n in counts.items():
            quota = self.of(tenant)
            if quota is None:
                continue
            if quota.max_payload_bytes is not None:
                self._check_payloads(tenant, quota.max_payload_bytes, specs, prefixes or [""] * len(specs))
            if quota.enqueue_per_second is not None:
                await self._spend(redis, tenant, quota.enqueue_per_second, n)

    @staticmethod
    def _check_payloads(tenant: str, most: int, specs: Sequence[TaskSpec], prefixes: Sequence[str]) -> None:
        for spec, prefix in zip(specs, prefixes, strict=True):
            if spec.tenant_id != tenant:
                continue
            size = len(orjson.dumps(spec.payload))
            if size > most:
                where = prefix + "payload"
                raise QuotaExceededError(
                    tenant,
                    "max_payload_bytes",
                    f"{where}: {size} bytes as JSON; tenant {tenant!r} has a max_payload_bytes quota of {most}",
                )

    async def _spend(self, redis: RedisStore, tenant: str, per_second: float, n: int) -> None:
        burst = max(1, round(per_second * self.burst_seconds))
        if n > burst:
            raise QuotaExceededError(
                tenant,
                "enqueue_per_second",
                f"{n} tasks at once are more than tenant {tenant!r} may ever create at once ({burst}, from its "
                f"enqueue_per_second quota of {per_second:g}): send smaller batches",
            )
        try:
            allowed, _, retry_after, _ = await redis.limits.rate_limit(f"enqueue:tenant:{tenant}", per_second, burst, n)
        except StoreError as exc:  # as the per-key limits: an outage must not refuse every create
            log.warning("quota_unchecked", tenant_id=tenant, quota="enqueue_per_second", error=str(exc))
            return
        if not allowed:
            raise QuotaExceededError(
                tenant,
                "enqueue_per_second",
                f"tenant {tenant!r} may create {per_second:g} tasks per second (bursts of {burst}) and is over it; "
                f"retry in {max(retry_after, 0.1):.1f} s",
                retry_after,
            )
