"""What a caller may see and touch: a key's tenant and queues, as a :class:`Reach`.

A key bound to a tenant sees only tasks, runs, dead-lettered tasks, search results, bulk
operations, schedules, keys and audit events of that tenant; a key bound to queues only
those of its queues. Anything beyond a key's reach answers exactly as if it did not exist
(404, an empty page, ``not_replayed``), so that a key cannot even learn that another
tenant's task id is real. Platform-wide views (queue depths, workers, metrics) count every
tenant's tasks, so a tenant-bound key is refused them (403).

Tasks without a tenant are the platform's: a tenant-bound key does not see them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from taskmesh.store.search_queries import SearchFilter


@dataclass(frozen=True)
class Reach:
    """The tenant (``None``: every tenant and none) and queues (``None``: every queue) a caller reaches."""

    tenant_id: str | None = None
    queues: frozenset[str] | None = None

    @property
    def unlimited(self) -> bool:
        """Whether the caller reaches everything (an unbound key, or an open instance)."""
        return self.tenant_id is None and self.queues is None

    def sees(self, tenant_id: str | None, queue: str) -> bool:
        """Whether a task (or schedule) of ``tenant_id`` on ``queue`` is within reach."""
        return (self.tenant_id is None or tenant_id == self.tenant_id) and self.sees_queue(queue)

    def sees_queue(self, queue: str) -> bool:
        """Whether ``queue`` is one of the caller's queues."""
        return self.queues is None or queue in self.queues

    def covers(self, tenant_id: str | None, queues: list[str] | None) -> bool:
        """Whether everything another reach (a bulk operation's, a key's) holds is within this one."""
        if self.tenant_id is not None and tenant_id != self.tenant_id:
            return False
        return self.queues is None or (queues is not None and set(queues) <= self.queues)

    def narrow(self, f: SearchFilter) -> SearchFilter | None:
        """The filter limited to this reach; ``None`` when nothing within reach can match.

        A ``tenant_id`` or ``queue`` filter beyond reach matches nothing (as a search for a
        tenant with no tasks would); without one, the reach's own tenant and queues are set.
        """
        if self.unlimited:
            return f
        if self.tenant_id is not None:
            if f.tenant_id is not None and f.tenant_id != self.tenant_id:
                return None
            f = replace(f, tenant_id=self.tenant_id)
        if self.queues is not None:
            if f.queue is not None:
                return f if f.queue in self.queues else None
            if len(self.queues) == 1:
                return replace(f, queue=next(iter(self.queues)))
            f = replace(f, queues=sorted(self.queues))
        return f


EVERYTHING = Reach()
"""The reach of an unbound key and of an open instance."""
