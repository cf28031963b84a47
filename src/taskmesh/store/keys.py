"""Redis key builders (design.md section 4): every key taskmesh touches is made here.

Each queue's keys share the hash tag ``{q}`` so every Lua script touches one
Redis Cluster slot.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIORITY_MAX = 1000
"""Highest accepted priority; the range is 0..1000, higher runs first."""
_EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z; keeps scores below 2**53
_PRIORITY_STEP = 1 << 43  # 2**43 ms is ~278 years of FIFO order per priority level


def ready_score(priority: int, ready_at_ms: int) -> float:
    """Score of a task in a ready set: lower pops first.

    Higher ``priority`` sorts first; within one priority, earlier ``ready_at_ms``
    (milliseconds since the Unix epoch) first. Exact in a double: priority
    0..1000 times 2**43 plus at most 2**43 stays below 2**53. The delayed mover's
    Lua script computes the same formula.
    """
    return float((PRIORITY_MAX - priority) * _PRIORITY_STEP + max(0, ready_at_ms - _EPOCH_MS))


@dataclass(frozen=True, slots=True)
class Keys:
    """Key builder for one prefix (``Settings.redis_prefix``)."""

    prefix: str

    def ready(self, queue: str) -> str:
        return f"{self.prefix}:{{{queue}}}:ready"

    def delayed(self, queue: str) -> str:
        return f"{self.prefix}:{{{queue}}}:delayed"

    def priorities(self, queue: str) -> str:
        """Hash task id -> priority of the delayed tasks, for the mover's ready score."""
        return f"{self.prefix}:{{{queue}}}:priority"

    def dlq(self, queue: str) -> str:
        return f"{self.prefix}:{{{queue}}}:dlq"

    def marker(self) -> str:
        """Written after each resync; its absence means Redis was flushed or restarted empty."""
        return f"{self.prefix}:marker"

    def lock(self, service: str, scope: str = "") -> str:
        return f"{self.prefix}:lock:{service}" + (f":{{{scope}}}" if scope else "")


EPOCH_MS = _EPOCH_MS
PRIORITY_STEP = _PRIORITY_STEP
