"""Repeated refusals counted, not written one by one: what a flood of refused requests adds to the audit log.

A refused request (outcome ``denied``: 401, 403, or 429 for too many refused authentications;
or any 429 of a change) is written in full when it is the first of its *kind* in ``window``
seconds (60); the next ones of that kind are only counted, and once the window ends one
``denied.repeated`` row says how many more there were (``details.count``), from when to when
(``first_at``, ``last_at``), on which actions and with which key ids. A kind is the client's
address (an IPv6 address by its /64, which one host can fill) with the status and, for an
anonymous caller, why it was refused (``unknown_key``, ``no_key``, ...), or for a key, the key
and the action.

At most ``kinds_most`` (100) kinds are open at once on an instance; a refusal of a new kind
beyond them is counted in one overflow kind per status (its row names no address; ``details``
lists up to 20). However many requests are refused, an instance thus writes about
2 x ``kinds_most`` rows per window at most. The counts live in the instance's memory, so a
Redis or PostgreSQL outage cannot unbound them; the ``denial_summaries`` service writes the
rows of ended windows (and the open ones when the instance stops).
"""

from __future__ import annotations

import ipaddress
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from taskmesh.security.audit import AuditEvent

WINDOW_SECONDS = 60.0
"""How long the first refusal of a kind stands for the ones after it."""
KINDS_MOST = 100
"""Most kinds open at once per instance; later new kinds share one overflow kind per status."""
ACTIONS_MOST = 20
"""Most distinct actions counted in one summary (the rest as ``other``)."""
SAMPLES_MOST = 20
"""Most key ids and addresses listed in one summary."""
SUMMARY_ACTION = "denied.repeated"
"""The action of a summary row."""
_OVERFLOW = object()
"""Marks the overflow kinds' keys (no address can be it)."""


def client_network(address: str | None) -> str:
    """The unit refusals are counted by: an IPv4 address itself, an IPv6 address's /64 network.

    One host commonly holds a whole IPv6 /64, so counting its addresses apart would count nothing.
    Anything that is not an IP address (a Unix socket's peer) is its own unit.
    """
    if not address:
        return "-"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:100]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass
class _Kind:
    first: AuditEvent
    opened: float
    first_at: datetime
    last_at: datetime | None = None
    count: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    key_ids: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    overflow: bool = False

    def add(self, event: AuditEvent, at: datetime) -> None:
        self.count += 1
        self.last_at = at
        action = event.action if event.action in self.actions or len(self.actions) < ACTIONS_MOST else "other"
        self.actions[action] += 1
        if event.actor_id and event.actor_id not in self.key_ids and len(self.key_ids) < SAMPLES_MOST:
            self.key_ids.append(event.actor_id)
        addr = event.client_addr
        if addr and addr not in self.addresses and len(self.addresses) < SAMPLES_MOST:
            self.addresses.append(addr)

    def summary(self, window: float) -> AuditEvent:
        details: dict[str, object] = {
            "count": self.count,
            "first_at": self.first_at.isoformat(),
            "last_at": None if self.last_at is None else self.last_at.isoformat(),
            "window_seconds": window,
            "actions": dict(self.actions),
        }
        refused = self.first.details.get("refused")
        if refused is not None:
            details["refused"] = refused
        keyed = self.first.actor_type == "key"
        if self.key_ids and not keyed:
            details["key_ids"] = self.key_ids
        if self.overflow:
            details["addresses"] = self.addresses
        if self.overflow:  # many callers: the row is the instance's own account of them
            return replace(
                self.first,
                action=SUMMARY_ACTION,
                actor_type="system",
                actor_id=None,
                actor_name=None,
                tenant_id=None,
                resource_type=None,
                resource_id=None,
                reason=None,
                trace_id=None,
                client_addr=None,
                user_agent=None,
                details={**details, "key_ids": self.key_ids},
                written=False,
                prepare=None,
            )
        return replace(
            self.first,
            action=SUMMARY_ACTION,
            actor_id=self.first.actor_id if keyed else None,
            resource_type=None,
            resource_id=None,
            reason=None,
            trace_id=None,
            details=details,
            written=False,
            prepare=None,
        )


class Denials:
    """The open kinds of refusals of one instance, and the summaries waiting to be written.

    :param window: seconds a kind stays open after its first refusal.
    :param kinds_most: most kinds open at once.
    :param clock: monotonic seconds (tests give their own).
    """

    def __init__(
        self,
        window: float = WINDOW_SECONDS,
        kinds_most: int = KINDS_MOST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.kinds_most = kinds_most
        self.clock = clock
        self._open: dict[Hashable, _Kind] = {}
        self._waiting: list[AuditEvent] = []

    def admit(self, event: AuditEvent) -> bool:
        """Whether to write ``event`` (a refusal, fully described) in full: the first of its kind in
        the window. Otherwise it is counted, and belongs to the kind's summary."""
        now, at = self.clock(), datetime.now(UTC)
        kind = self._kind_of(event)
        open_kind = self._open.get(kind)
        if open_kind is not None and now - open_kind.opened < self.window:
            open_kind.add(event, at)
            return False
        if open_kind is not None:  # its window ended and the service has not come by yet
            self._close(kind, open_kind)
        if len(self._open) < self.kinds_most:
            self._open[kind] = _Kind(event, now, at)
            return True
        overflow = (_OVERFLOW, event.status)
        spill = self._open.get(overflow)
        if spill is None or now - spill.opened >= self.window:
            if spill is not None:
                self._close(overflow, spill)
            # No first row for the overflow: every refusal in it, this one too, is only counted.
            spill = self._open[overflow] = _Kind(replace(event, details={}), now, at, overflow=True)
        spill.add(event, at)
        return False

    def due(self, *, everything: bool = False) -> list[AuditEvent]:
        """The summaries to write now: those of the windows that ended (of every open kind with
        ``everything``, when the instance stops), and any kept by :meth:`keep`. Their kinds close."""
        now = self.clock()
        for kind, open_kind in list(self._open.items()):
            if everything or now - open_kind.opened >= self.window:
                self._close(kind, open_kind)
        waiting, self._waiting = self._waiting, []
        return waiting

    def keep(self, summaries: Sequence[AuditEvent]) -> None:
        """Summaries that could not be written, to try again first (at most ``2 x kinds_most`` wait:
        through a long PostgreSQL outage the newest are dropped rather than memory grown)."""
        self._waiting = [*summaries, *self._waiting][: self._waiting_most]

    @property
    def _waiting_most(self) -> int:
        return 2 * self.kinds_most + 2

    def _close(self, kind: Hashable, open_kind: _Kind) -> None:
        del self._open[kind]
        if open_kind.count > 0 and len(self._waiting) < self._waiting_most:
            self._waiting.append(open_kind.summary(self.window))

    @staticmethod
    def _kind_of(event: AuditEvent) -> Hashable:
        network = client_network(event.client_addr)
        if event.actor_type == "key":
            return (network, event.status, "key", event.actor_id, event.action)
        return (network, event.status, event.actor_type, event.details.get("refused"))
