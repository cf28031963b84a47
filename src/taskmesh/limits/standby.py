"""Tasks claimed ahead of a full limit key, each waiting in its instance for the slot of the next run of
its key that ends there.

Without this, a limit as large as the executors leaves nothing to claim ahead: each freed slot costs a
round of release, pop, admission and claim before an executor has work again. So the admission
(``lua/limits_admit.lua``) lets a fetcher that may claim ahead (its ``prefetch``) claim ids of a full
key too ("standby"), when that key is the task's only limit key and a concurrency without a rate: as
far ahead of the key's slots as the queue claims ahead of its executors (a limit of 8 in a queue of 32
executors and a prefetch of 128 holds up to 32 of the key's tasks so, at least one). They wait here,
not in the executors' channel: an executor never waits on a slot while other work could run. When a
run of the key ends here, its slot goes to the oldest of them at once, in the process; the slot
releaser renames the slot in Redis in its next call (``lua/limits_standby.lua``), which keeps the
key's count of slots and lets one more of its parked ids be claimed ahead in turn. Standby tasks whose
key has room in Redis (a slot freed on another instance) take one there and start; the releaser asks
at each call that handed nothing over.

A standby task is claimed: it holds a lease (the heartbeat keeps it), counts its attempt once, shows as
running, and is handed back with the other claimed tasks at shutdown. A key backing off (a handler's
``RateLimited``) hands nothing over until its time: at once for a run of this instance, within one call
of the releaser for a run of another; nor does a key whose limit was lowered at run time below the
slots it holds, or given a rate.
"""

from __future__ import annotations

import time
import uuid
from collections import deque

from taskmesh.limits.book import FAIR_MARK
from taskmesh.tasks.models import ClaimedTask


def standby_key(limit_keys: list[str] | None) -> str | None:
    """The one limit key a task may be claimed ahead for (``None``: it has none, or more than one)."""
    keys = [k for k in limit_keys or () if not k.startswith(FAIR_MARK)]
    return keys[0] if len(keys) == 1 else None


class Standbys:
    """One queue's tasks claimed ahead of their full limit key, in the order claimed (see module docs)."""

    def __init__(self) -> None:
        self._by_key: dict[str, deque[ClaimedTask]] = {}
        self._backing_off: dict[str, float] = {}
        self._stopped: set[str] = set()
        self.total = 0
        """Tasks waiting here."""
        self._running: dict[str, int] = {}

    def run_started(self, task: ClaimedTask) -> None:
        """A run of ``task`` started here (counted under its one limit key, if it has one)."""
        key = standby_key(task.limit_keys)
        if key is not None:
            self._running[key] = self._running.get(key, 0) + 1

    def run_ended(self, task: ClaimedTask) -> None:
        """The run of ``task`` ended (see :meth:`run_started`)."""
        key = standby_key(task.limit_keys)
        if key is not None:
            n = self._running.get(key, 0) - 1
            if n > 0:
                self._running[key] = n
            else:
                self._running.pop(key, None)

    def running(self, key: str) -> int:
        """This instance's runs of ``key`` now."""
        return self._running.get(key, 0)

    def add(self, task: ClaimedTask, key: str) -> None:
        """``task`` was claimed ahead of ``key``."""
        self._by_key.setdefault(key, deque()).append(task)
        self.total += 1

    def counts(self) -> dict[str, int]:
        """``{limit key: tasks waiting for it}`` (the admission's ``standing``)."""
        return {k: len(q) for k, q in self._by_key.items() if q}

    def back_off(self, key: str, seconds: float) -> None:
        """Hand no slot of ``key`` over for ``seconds`` (a ``RateLimited``)."""
        self._backing_off[key] = max(self._backing_off.get(key, 0.0), time.monotonic() + seconds)

    def stop(self, key: str, stopped: bool) -> None:
        """Whether slots of ``key`` may be handed over (not while its slots exceed a limit lowered at run
        time, or it has a rate: then they go back to Redis and those waiting here start as it has room)."""
        if stopped:
            self._stopped.add(key)
        else:
            self._stopped.discard(key)

    def next_for(self, ended: ClaimedTask) -> tuple[str, ClaimedTask] | None:
        """The task to hand the slot of ``ended``'s run to, and the key, if one waits and its key is not
        backing off; it is taken out of here."""
        key = standby_key(ended.limit_keys)
        if key is None:
            return None
        waiting = self._by_key.get(key)
        if not waiting or key in self._stopped or self._backing_off.get(key, 0.0) > time.monotonic():
            return None
        self.total -= 1
        return key, waiting.popleft()

    def waiting(self) -> list[tuple[str, str]]:
        """``(task id, limit key)`` of every task waiting here."""
        return [(str(t.task_id), k) for k, q in self._by_key.items() for t in q]

    def take(self, task_ids: set[uuid.UUID]) -> list[ClaimedTask]:
        """Take out and return the tasks of ``task_ids`` (they took a slot in Redis)."""
        taken: list[ClaimedTask] = []
        for key, waiting in self._by_key.items():
            kept: deque[ClaimedTask] = deque()
            for task in waiting:
                (taken if task.task_id in task_ids else kept).append(task)
            self._by_key[key] = kept
        self.total -= len(taken)
        return taken

    def clear(self) -> None:
        """Forget every task (they are handed back with the other claimed tasks)."""
        self._by_key.clear()
        self.total = 0
