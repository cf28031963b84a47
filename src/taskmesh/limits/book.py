"""The limits in force, and the limit keys a task holds (pure: no I/O).

A **limit key** names one counter: ``<limit>`` for a limit without a ``key``, ``<limit>:<value>``
for one with (``per_customer:42``). A task's limit keys are decided once, at enqueue, from the
limits then in force (an operator's retry into another queue decides their queue's part again:
:meth:`LimitBook.keys_moved`), and stored with it (``tasks.limit_keys``); the admission stage
(``store/lua/limits_admit.lua``) holds each key to its limit's numbers as they are at that moment,
so a changed number applies at once to queued tasks, and a limit declared later applies to tasks
enqueued after it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from taskmesh.errors import InvalidTaskError
from taskmesh.limits.settings import LIMIT_NAME, FairnessSettings, LimitSettings
from taskmesh.store.keys import PRIORITY_STEP

if TYPE_CHECKING:
    from taskmesh.config import Settings

VALUE_MAX = 100
"""Longest key value kept as it is; a longer one (or one holding a control character) is kept as its digest."""
SEPARATOR = "\n"
"""Between the limit keys of one task in Redis (no key holds it)."""
FAIR_MARK = "@"
"""Starts a task's fairness key among its limit keys (``@acme``): no limit's name starts so, so the admission
holds it to nothing, and the fair scoring of its queue (``lua/fair_lib.lua``) reads it."""


def key_value(value: Any) -> str:
    """A key's value as the text of its limit key: strings as they are, anything else as JSON.

    A value longer than :data:`VALUE_MAX` or holding a control character becomes ``#`` and its
    SHA-256's first 32 hex digits, so that a limit key stays short and one line.
    """
    text = value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    if len(text) > VALUE_MAX or not text.isprintable():
        return "#" + hashlib.sha256(text.encode()).hexdigest()[:32]
    return text


def _lookup(payload: Any, path: str) -> Any:
    """The value at ``payload.<a>.<b>`` (``path`` is ``a.b``); ``None`` when any step is missing."""
    for part in path.split("."):
        if not isinstance(payload, dict) or part not in payload:
            return None
        payload = payload[part]
    return payload


def limit_name(limit_key: str) -> str:
    """The limit a limit key counts for (``per_customer:42`` → ``per_customer``)."""
    return limit_key.partition(":")[0]


@dataclass(frozen=True, slots=True)
class Override:
    """A limit set at run time (a row of ``limits``): who set it and when."""

    settings: LimitSettings
    updated_at: datetime
    updated_by: str | None


class LimitBook:
    """The limits in force, by name (see module docs): the configured ones, each overridden (or joined) by
    a limit set at run time (``limits/live.py`` reads those every second).

    :param limits: ``{name: settings}`` as configured.
    :param fairness: ``{queue: settings}`` of the queues whose keys get fair shares (``[queues.<q>] fairness``).
    :param aging: ``{queue: seconds}``: a waiting task's priority rises by one per this many seconds
        (``[queues.<q>] priority_aging_seconds``).
    """

    def __init__(
        self,
        limits: Mapping[str, LimitSettings] | None = None,
        fairness: Mapping[str, FairnessSettings] | None = None,
        aging: Mapping[str, float] | None = None,
    ) -> None:
        self.fairness: dict[str, FairnessSettings] = dict(fairness or {})
        self.aging: dict[str, float] = dict(aging or {})
        self.config: dict[str, LimitSettings] = dict(limits or {})
        self.overrides: dict[str, Override] = {}
        self.limits: dict[str, LimitSettings] = dict(self.config)
        self.read_at: float | None = None
        """When the overrides were last read (``time.monotonic``); ``None``: never."""

    @classmethod
    def of_settings(cls, settings: Settings) -> LimitBook:
        """The limits, fair shares and priority aging an instance's ``settings`` declare."""
        queues = settings.queues.items()
        return cls(
            settings.limits,
            {q: e.fairness for q, e in queues if e.fairness is not None},
            {q: e.priority_aging_seconds for q, e in queues if e.priority_aging_seconds is not None},
        )

    def apply(self, overrides: Mapping[str, Override]) -> list[str]:
        """Make ``overrides`` the limits set at run time; returns the names whose limit changed."""
        merged = {**self.config, **{name: o.settings for name, o in overrides.items()}}
        changed = sorted(n for n in merged.keys() | self.limits.keys() if merged.get(n) != self.limits.get(n))
        self.overrides = dict(overrides)
        self.limits = merged
        return changed

    def source(self, name: str) -> str:
        """``api`` for a limit set at run time, else ``config``."""
        return "api" if name in self.overrides else "config"

    def __bool__(self) -> bool:
        return bool(self.limits or self.fairness)

    def applies_in(self, queue: str) -> bool:
        """Whether any limit may hold a task of ``queue``, or it has fair shares (then its fetcher admits what
        it pops: the admission also feeds a fair queue's ready set)."""
        return queue in self.fairness or any(s.queue is None or s.queue == queue for s in self.limits.values())

    def keys_for(
        self,
        *,
        queue: str,
        name: str,
        tenant_id: str | None,
        payload: Any,
        concurrency_key: str | None = None,
        field: str = "concurrency_key",
        payload_known: bool = True,
    ) -> list[str] | None:
        """The limit keys of a task to enqueue, in the limits' name order, then its fairness key (``@<value>``)
        in a queue with fair shares; ``None`` when no limit holds it.

        A limit holds a task when its ``queue`` and ``task`` select it; with a ``key``, the task's value
        of it (a missing one is the empty value, one counter for all such tasks) names the counter.
        ``concurrency_key`` (``<limit>`` or ``<limit>:<value>``) adds a counter of the limit it names.
        Without ``payload_known`` (a workflow's map over a dep's result: its items come later), a limit or
        fair share keyed by a payload path holds nothing.

        :raises InvalidTaskError: ``concurrency_key`` names no limit in force (on ``field``).
        """
        keys: list[str] = []
        for limit, s in sorted(self.limits.items()):
            if not s.selects or (s.queue is not None and s.queue != queue) or (s.task is not None and s.task != name):
                continue
            if s.key is None:
                keys.append(limit)
                continue
            if s.key != "tenant_id" and not payload_known:
                continue
            value = tenant_id if s.key == "tenant_id" else _lookup(payload, s.key.removeprefix("payload."))
            keys.append(f"{limit}:{'' if value is None else key_value(value)}")
        fair = self.fairness.get(queue)
        if fair is not None and (payload_known or fair.key == "tenant_id"):
            value = tenant_id if fair.key == "tenant_id" else _lookup(payload, fair.key.removeprefix("payload."))
            keys.append(FAIR_MARK + ("" if value is None else key_value(value)))
        if concurrency_key is not None:
            named = limit_name(concurrency_key)
            if not LIMIT_NAME.fullmatch(named) or named not in self.limits:
                known = ", ".join(sorted(self.limits)) or "none is configured"
                raise InvalidTaskError(field, f"names no limit in force ({named!r}; limits: {known})")
            _, colon, value = concurrency_key.partition(":")
            key = f"{named}:{key_value(value)}" if colon else named
            if key not in keys:
                keys.append(key)
        return keys or None

    def keys_moved(
        self, keys: Sequence[str] | None, *, queue: str, name: str, tenant_id: str | None, payload: Any
    ) -> list[str] | None:
        """The limit keys of a task that moves into ``queue`` (an operator's retry into another queue), from the
        ``keys`` it held; ``None`` when it holds none there.

        A key of a limit scoped to another queue goes (that limit holds the tasks of its queue only); the keys of
        the limits scoped to ``queue`` that select the task come (by its name, tenant and payload, as
        :meth:`keys_for` decides them); its fairness key is ``queue``'s (none in a queue without fair shares).
        Every other key stays as the create decided it: a limit of any queue, a counter its ``concurrency_key``
        named, a limit no longer in force (which holds nothing). Limit keys by name, then the fairness key.
        """
        kept = set()
        for lk in keys or ():
            s = self.limits.get(limit_name(lk))
            if not lk.startswith(FAIR_MARK) and (s is None or s.queue is None or s.queue == queue):
                kept.add(lk)
        fair: list[str] = []
        for lk in self.keys_for(queue=queue, name=name, tenant_id=tenant_id, payload=payload) or ():
            if lk.startswith(FAIR_MARK):
                fair.append(lk)
            elif self.limits[limit_name(lk)].queue == queue:
                kept.add(lk)
        return sorted(kept) + fair or None

    def priority_step(self, queue: str) -> int:
        """The ready-score distance between two priorities in ``queue``, ms: its aging's seconds per level (a task
        that waited that long more ranks one level higher), else :data:`~taskmesh.store.keys.PRIORITY_STEP`
        (priority first, whatever the wait)."""
        seconds = self.aging.get(queue)
        return PRIORITY_STEP if seconds is None else max(1, round(seconds * 1000))

    def fair_args(self, queue: str) -> list[str | float] | None:
        """The fair shares of ``queue`` as the scripts read them: ``default weight, count, then value, weight``
        per weighted key; ``None`` for a queue served first come, first served."""
        fair = self.fairness.get(queue)
        if fair is None:
            return None
        args: list[str | float] = [fair.default_weight, len(fair.weights)]
        for value, weight in sorted(fair.weights.items()):
            args += [key_value(value), weight]
        return args

    def script_args(self) -> list[str | int | float]:
        """The limits' numbers as the admission scripts read them: a count, then per limit
        ``name, concurrency (0: none), interval_ms (0: no rate), burst``."""
        args: list[str | int | float] = [len(self.limits)]
        for limit, s in sorted(self.limits.items()):
            per_second = s.per_second
            args += [limit, s.concurrency or 0, 0 if per_second is None else 1000.0 / per_second, s.burst]
        return args
