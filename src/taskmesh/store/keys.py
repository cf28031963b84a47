"""Redis key builders and scores (docs/internals/design.md section 4): every key taskmesh touches is made here.

Each queue's keys share the hash tag ``{q}`` so every Lua script touches one
Redis Cluster slot; a singleton lock scoped to a queue carries the same tag.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIORITY_MAX = 1000
"""Highest accepted priority; the range is 0..1000, higher runs first."""
EPOCH_MS = 1_704_067_200_000
"""2024-01-01T00:00:00Z: ready scores count from here, which keeps them below 2**53."""
PRIORITY_STEP = 1 << 43
"""Ready-score distance between two priorities: 2**43 ms is ~278 years of FIFO order per level."""
DELAYED_PRIORITY_SLOTS = 1024
"""A delayed score is ``due_ms * 1024 + priority``: the priority travels with the id, so losing
any other key cannot send a due task to ready at the wrong priority. Exact in a double until
the year 2248 (``due_ms * 1024 < 2**53``)."""
DLQ_MIRROR_MAX = 10_000
"""The DLQ mirror of a queue holds its oldest dead-lettered ids, at most this many (PostgreSQL has them all)."""
LEGACY_DELAYED_SCORE_MAX = 10**14
"""Delayed scores below this were written by versions before 0.2 (score = due_ms, priority in a
hash); the mover converts them (``delayed_move.lua``)."""


def ready_score(priority: int, ready_at_ms: int, step: int = PRIORITY_STEP) -> int:
    """Score of a task in a ready set: lower pops first.

    Higher ``priority`` sorts first; within one priority, earlier ``ready_at_ms``
    (milliseconds since the Unix epoch) first. Exact in a double: priority
    0..1000 times 2**43 plus at most 2**43 stays below 2**53. The delayed mover's
    Lua script computes the same formula.

    A queue with priority aging has a smaller ``step`` (its seconds per level, in ms): then a task that
    waited ``step`` ms longer ranks as one of the next priority, and the order of two tasks never changes
    while they wait (each one's priority rises at the same pace), so it can be fixed when it is pushed.

    An integer, not a float: Redis reads either as the same double, and the client writes
    an integer for a third of a float's cost (0.4 against 1.2 µs per member of a ``ZADD``).
    """
    return (PRIORITY_MAX - priority) * step + max(0, ready_at_ms - EPOCH_MS)


def delayed_score(due_ms: int, priority: int) -> int:
    """Score of a task in a delayed set: due time in ms times 1024, plus its priority (0..1000).

    An integer, as :func:`ready_score`.
    """
    return due_ms * DELAYED_PRIORITY_SLOTS + priority


@dataclass(frozen=True, slots=True)
class Keys:
    """Key builder for one prefix (``Settings.redis_prefix``)."""

    prefix: str

    def ready(self, queue: str) -> str:
        """Sorted set of ready task ids, scored by :func:`ready_score`."""
        return f"{self.prefix}:{{{queue}}}:ready"

    def delayed(self, queue: str) -> str:
        """Sorted set of delayed task ids, scored by :func:`delayed_score`."""
        return f"{self.prefix}:{{{queue}}}:delayed"

    def priorities(self, queue: str) -> str:
        """Hash task id -> priority of delayed tasks written before 0.2 (read once, then deleted)."""
        return f"{self.prefix}:{{{queue}}}:priority"

    def dlq(self, queue: str) -> str:
        """Sorted set of dead-lettered task ids scored by when they failed (ms since the epoch), a
        mirror of PostgreSQL's oldest :data:`DLQ_MIRROR_MAX`: adding or removing one id costs
        O(log n), however many the queue holds."""
        return f"{self.prefix}:{{{queue}}}:dead"

    def legacy_dlq(self, queue: str) -> str:
        """The list the DLQ mirror was in earlier versions (each removal scanned it); the reconciler deletes it."""
        return f"{self.prefix}:{{{queue}}}:dlq"

    def foreign(self, queue: str) -> str:
        """List where members taskmesh did not write are set aside (newest first, capped)."""
        return f"{self.prefix}:{{{queue}}}:foreign"

    def finished(self) -> str:
        """Pub/sub channel of the ids of tasks that just finished (``store/finished.py``)."""
        return f"{self.prefix}:finished"

    def finished_waiters(self) -> str:
        """Set, with a TTL, while some request waits for a task to finish: only then is it published."""
        return f"{self.prefix}:finished:waiters"

    def marker(self, queue: str) -> str:
        """Written after a queue's resync, in its slot; its absence means the queue's keys were lost."""
        return f"{self.prefix}:{{{queue}}}:marker"

    def limit_base(self, queue: str) -> str:
        """The start of every key of ``queue``'s limits (``lua/limits_lib.lua`` names them), in its slot."""
        return f"{self.prefix}:{{{queue}}}:lim:"

    def limit_tasks(self, queue: str) -> str:
        """Hash task id -> its limit keys (one per line), for the queue's queued tasks that hold any."""
        return f"{self.prefix}:{{{queue}}}:lim:tasks"

    def limit_wake(self, queue: str) -> str:
        """Sorted set of the queue's limit keys with parked ids, scored by when to look at them again (ms)."""
        return f"{self.prefix}:{{{queue}}}:lim:wake"

    def fair_state(self, queue: str) -> str:
        """Hash of a queue with fair shares: the size its ready set is fed to, a slot's lease (``lua/fair_lib.lua``)."""
        return f"{self.prefix}:{{{queue}}}:lim:fair:state"

    def fair_keys(self, queue: str) -> str:
        """Sorted set fairness key -> its dispatched ids per weight, over the keys with ids waiting their turn."""
        return f"{self.prefix}:{{{queue}}}:lim:fair:keys"

    def rate_limit(self, bucket: str) -> str:
        """A rate-limit bucket (``{class}:{key id}``): a GCRA arrival time, its TTL its own end."""
        return f"{self.prefix}:ratelimit:{bucket}"

    def lock(self, service: str, queue: str = "") -> str:
        """A singleton lock; scoped to ``queue`` it shares that queue's hash tag (slot)."""
        return f"{self.prefix}:lock:{service}" + (f":{{{queue}}}" if queue else "")
