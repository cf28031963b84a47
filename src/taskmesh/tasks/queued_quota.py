"""A tenant's ``max_queued`` quota, held exactly: counted and enforced in the transaction that creates the tasks.

A create of tasks of a tenant with a ``max_queued`` quota writes its rows, then takes the tenant's
transaction-scoped advisory lock (``pg_advisory_xact_lock``, one per tenant, taken in one order
for a batch of several tenants), then counts the tenant's queued and running tasks, its own new
rows included, and rolls everything back when they are more than the quota. The lock is held
until the commit, and PostgreSQL releases it only once the commit is visible; the next create of
the tenant, on any instance or client, counts after it (a new statement's snapshot, in READ
COMMITTED), so no two creates can both take the last place. Rows are written before the lock,
so creates of one tenant wait for each other only for a count and a commit.

A tenant without a quota costs nothing: no lock, no query. The count reads at most the quota
plus the new tasks' index entries (``tasks_tenant_open_idx``).

Reads ``tasks``; writes nothing of its own. A refusal is
:class:`~taskmesh.errors.QuotaExceededError` (the API answers 429 naming ``max_queued``); a store
failure is a :class:`~taskmesh.errors.StoreError` and the create is rolled back with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from taskmesh.errors import InvalidTaskError, QuotaExceededError
from taskmesh.store import PgStore

if TYPE_CHECKING:
    from taskmesh.config import Settings, TenantQuota


@dataclass(frozen=True)
class QueuedLimits:
    """Most tasks queued or running per tenant: its own limit, else the default (``None``: no limit).

    :param by_tenant: ``{tenant: max_queued}``.
    :param default: the limit of every tenant not in ``by_tenant``.
    """

    by_tenant: Mapping[str, int | None] = field(default_factory=dict)
    default: int | None = None

    @classmethod
    def of_quotas(cls, by_tenant: Mapping[str, TenantQuota], default: TenantQuota | None) -> QueuedLimits | None:
        """The ``max_queued`` of quotas (``tenant_quotas``, ``tenant_quota_default``); ``None``: none has one."""
        limits = {tenant: quota.max_queued for tenant, quota in by_tenant.items()}
        most = default.max_queued if default is not None else None
        if most is None and all(v is None for v in limits.values()):
            return None
        return cls(limits, most)

    @classmethod
    def of_settings(cls, settings: Settings) -> QueuedLimits | None:
        """The ``max_queued`` quotas of an instance's settings (for a :class:`~taskmesh.Client` to hold them too)."""
        return cls.of_quotas(settings.tenant_quotas, settings.tenant_quota_default)

    def of(self, tenant_id: str | None) -> int | None:
        """The tenant's limit (``None``: none, also for a task without a tenant)."""
        if tenant_id is None:
            return None
        return self.by_tenant[tenant_id] if tenant_id in self.by_tenant else self.default

    def limited(self, tenants: Iterable[str | None]) -> bool:
        """Whether any of ``tenants`` (tenant ids or ``None``) has a limit."""
        return any(self.of(t) is not None for t in tenants)

    async def enforce(self, pg: PgStore, created: Mapping[str, int]) -> None:
        """Refuse the transaction on ``pg`` when a tenant holds more open tasks than its limit.

        Call it after the creates' rows are written and before the commit.

        :param pg: the store of the transaction that wrote the rows.
        :param created: tasks created (not deduplicated) per tenant in that transaction.
        :raises QuotaExceededError: naming the first such tenant (sorted); roll the transaction back.
        :raises InvalidTaskError: ``connection``: the transaction is not READ COMMITTED (its snapshot
            could miss tasks committed meanwhile, and the count would not be exact).
        :raises StoreError: PostgreSQL failed.
        """
        limits = {t: (most, n) for t, n in created.items() if n and (most := self.of(t)) is not None}
        if not limits:
            return
        tenants = sorted(limits)
        isolation = await pg.tasks.lock_tenants(tenants)
        if isolation != "read committed":
            raise InvalidTaskError(
                "connection",
                f"tasks of a tenant with a max_queued quota are created in a READ COMMITTED transaction, not "
                f"{isolation}: its snapshot could miss tasks other transactions committed",
            )
        # One more than the quota and the new tasks: enough to say exactly how many were there before.
        counts = await pg.tasks.count_open_of_tenants(tenants, [limits[t][0] + limits[t][1] + 1 for t in tenants])
        for tenant in tenants:
            most, n = limits[tenant]
            total = counts[tenant]
            if total > most:
                before = total - n
                held = str(before) if total <= most + n else f"more than {most}"
                raise QuotaExceededError(
                    tenant,
                    "max_queued",
                    f"tenant {tenant!r} has {held} tasks queued or running and its max_queued quota is {most}: "
                    f"{n} more would exceed it",
                )


def created_by_tenant(tenants: Iterable[str | None]) -> Counter[str]:
    """How many of the created tasks each tenant has (``tenants``: one tenant id or ``None`` per created task)."""
    return Counter(t for t in tenants if t is not None)
