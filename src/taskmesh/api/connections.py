"""Who may hold the HTTP server's connections: a cap for the instance and one per client address.

:class:`ConnectionGuard` is the state one server's connections share (the protocol in
:mod:`taskmesh.api.server` asks it at each accept and tells it at each close):

- ``max_connections`` (setting ``http_max_connections``, 1,000): open connections of the instance.
- ``max_connections_per_address`` (``http_max_connections_per_address``, 100): open connections of
  one client address, so that one host's slow connections cannot take the whole instance's cap
  from every other client. IPv4 addresses count one by one; IPv6 ones by their /64 (what one
  host or one home network is given), an IPv4-mapped one as its IPv4 address. Behind a proxy
  every connection is the proxy's: see the README's Deployment section.

A connection over either cap is accepted and closed at once (the server's protocol does it),
counted in ``taskmesh_http_refused_total{reason}`` and logged at most once per 10 s with a count
(:class:`~taskmesh.observability.log_throttle.ThrottledLog`): ``http_connections_capped`` (open, limit) and
``http_address_connections_capped`` (address, open: that address's, limit). The guard also holds
the throttled lines of the protocol's own refusals (``http_headers_too_large``, ``http_read_timeout``).
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from taskmesh.observability.log_throttle import ThrottledLog
from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import HTTP_REFUSAL_REASONS, Metrics

if TYPE_CHECKING:
    from taskmesh.api.server import HttpLimits

__all__ = ["ConnectionGuard", "address_key"]

log = get_logger("taskmesh.http")

_EVENTS = {
    "headers_too_large": "http_headers_too_large",
    "read_timeout": "http_read_timeout",
    "too_many_connections": "http_connections_capped",
    "too_many_connections_from_address": "http_address_connections_capped",
}

IPV6_PREFIX = 64
"""An IPv6 client's connections count against its /64: one host can take any address in it."""


def address_key(host: str | None) -> str | None:
    """What a client's connections are counted by: its IPv4 address, or its IPv6 address's /64.

    :param host: the peer's address as the socket gives it (``None``: a Unix socket, not counted).
    :returns: ``"203.0.113.7"``, ``"2001:db8:1:2::/64"``; a name that is not an address as it is.
    """
    if host is None or ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, IPV6_PREFIX), strict=False))


class ConnectionGuard:
    """The limits, the open connections in all and by address, the refusal counters and log lines.

    :param limits: what the server grants (:class:`~taskmesh.api.server.HttpLimits`).
    :param metrics: where refusals are counted; ``None`` counts nothing.
    """

    def __init__(self, limits: HttpLimits, metrics: Metrics | None) -> None:
        self.limits = limits
        self.open = 0
        self.by_address: dict[str, int] = {}
        self.counters: dict[str, Counter] = (
            {} if metrics is None else {reason: metrics.http_refused.labels(reason) for reason in HTTP_REFUSAL_REASONS}
        )
        self.throttles = {reason: ThrottledLog(log, event) for reason, event in _EVENTS.items()}

    def admit(self, address: str | None) -> bool:
        """Count a new connection from ``address`` (an :func:`address_key`), unless a cap refuses it.

        A refusal is counted and logged here; the caller closes the connection.

        :returns: whether the connection is admitted (then :meth:`release` it when it closes).
        """
        limits = self.limits
        if self.open >= limits.max_connections:
            self.refused("too_many_connections", open=self.open, limit=limits.max_connections)
            return False
        held = 0 if address is None else self.by_address.get(address, 0)
        if address is not None and held >= limits.max_connections_per_address:
            self.refused(
                "too_many_connections_from_address",
                address=address,
                open=held,
                limit=limits.max_connections_per_address,
            )
            return False
        self.open += 1
        if address is not None:
            self.by_address[address] = held + 1
        return True

    def release(self, address: str | None) -> None:
        """An admitted connection from ``address`` closed."""
        self.open -= 1
        if address is not None:
            left = self.by_address.get(address, 0) - 1
            if left > 0:
                self.by_address[address] = left
            else:
                self.by_address.pop(address, None)

    def refused(self, reason: str, **fields: Any) -> None:
        """Count a refusal of ``reason`` and log it, throttled.

        ``reason`` is one of :data:`~taskmesh.observability.metrics.HTTP_REFUSAL_REASONS`.
        """
        counter = self.counters.get(reason)
        if counter is not None:
            counter.inc()
        self.throttles[reason].record(**fields)

    def close(self) -> None:
        """Log what the throttles still hold (the server stops)."""
        for throttle in self.throttles.values():
            throttle.flush()
