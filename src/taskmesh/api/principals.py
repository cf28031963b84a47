"""Callers of the API: a :class:`Principal` per request, found through a :class:`KeyCache`.

See :mod:`taskmesh.api.auth` for how routes use them and when an instance runs open.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from taskmesh.errors import AuthenticationError
from taskmesh.observability.logs import get_logger
from taskmesh.security import keys as api_keys
from taskmesh.security.tenancy import Reach
from taskmesh.store import PgStore

log = get_logger("taskmesh.auth")

RATE_CLASSES = {
    "tasks:read": "read",
    "workers:read": "read",
    "metrics:read": "read",
    "audit:read": "read",
    "tasks:write": "write",
    "tasks:cancel": "write",
    "dlq:replay": "write",
    "queues:admin": "admin",
    "schedules:admin": "admin",
    "keys:admin": "admin",
}
"""The rate-limit class of each scope's routes."""


@dataclass(frozen=True)
class RatePolicy:
    """Requests per second and burst of one class (``read``, ``write``, ``admin``), per API key."""

    per_second: float
    burst: int

    @classmethod
    def of(cls, per_second: float, burst_seconds: float) -> RatePolicy:
        """The policy of a rate whose bursts last ``burst_seconds`` (at least one request)."""
        return cls(per_second, max(1, round(per_second * burst_seconds)))

    def header(self, name: str) -> str:
        """The policy as an IETF ``RateLimit-Policy`` item: quota ``q`` in a window ``w`` of seconds."""
        return f'"{name}";q={self.burst};w={max(1, round(self.burst / self.per_second))}'


KEY_CACHE_SECONDS = 5.0
"""How long an instance trusts what it read of a key (revocation reaches every instance within this)."""


@dataclass(frozen=True)
class Principal:
    """The caller: its key id (``None`` on an open instance), name, scopes, tenant and queues."""

    key_id: str | None
    name: str
    scopes: frozenset[str]
    tenant_id: str | None = None
    queues: frozenset[str] | None = None
    rate_limits: dict[str, float] | None = None
    """The key's own requests per second by class, instead of the settings' (``None``: the settings')."""
    expires_at: datetime | None = None
    """When the key stops working (``None``: never); a key it makes or rotates ends no later."""

    def allows(self, scope: str) -> bool:
        """Whether the caller holds ``scope``."""
        return scope in self.scopes

    @property
    def reach(self) -> Reach:
        """The tenant and queues the caller sees and acts on."""
        return Reach(self.tenant_id, self.queues)


ANONYMOUS = Principal(None, "anonymous", frozenset(api_keys.SCOPES))
"""The caller of an open instance: every scope, no tenant."""


@dataclass
class KeyCache:
    """Keys by id as last read, and whether the instance runs open, each trusted for ``ttl`` seconds.

    :param enforce: ``False`` for ``auth = "none"``: every request is :data:`ANONYMOUS`.
    :param loopback: the instance listens on a loopback address only (open until a first key is made).
    """

    enforce: bool = True
    loopback: bool = True
    ttl: float = KEY_CACHE_SECONDS
    _keys: dict[str, tuple[float, Any]] = field(default_factory=dict)
    _open: tuple[float, bool] | None = None
    _pepper: bytes | None = None
    _marked: dict[str, float] = field(default_factory=dict)

    async def is_open(self, pg: PgStore) -> bool:
        """Whether requests need no key now.

        :raises StoreError: PostgreSQL failed (the request answers 503; nothing is let through).
        """
        if not self.enforce:
            return True
        if not self.loopback:
            return False
        now = time.monotonic()
        if self._open is None or now - self._open[0] >= self.ttl:
            was = None if self._open is None else self._open[1]
            self._open = (now, not await pg.keys.any())
            if was is not self._open[1]:
                if self._open[1]:
                    log.warning("auth_open", reason="listening on loopback and no API key was made yet")
                elif was is not None:
                    log.info("auth_enforced", reason="an API key was made")
        return self._open[1]

    async def principal(self, pg: PgStore, presented: str | None) -> Principal:
        """The caller of a request presenting ``presented`` (a key, or ``None``).

        :raises AuthenticationError: no key, a malformed, unknown, wrong, revoked or expired one.
        :raises StoreError: PostgreSQL failed.
        """
        if await self.is_open(pg):
            return ANONYMOUS
        if not presented:
            raise AuthenticationError("an API key is required: Authorization: Bearer tmk_<id>_<secret>", "no_key")
        parsed = api_keys.parse(presented)
        if parsed is None:
            raise AuthenticationError("the API key is not of the form tmk_<id>_<secret>", "malformed")
        key_id, secret = parsed
        row = await self._row(pg, key_id)
        pepper = self._pepper
        if row is None or pepper is None or not api_keys.matches(pepper, secret, bytes(row["secret_hash"])):
            raise AuthenticationError(f"no valid key has id {key_id}")
        return await self._active(pg, key_id, row)

    async def principal_of_key(self, pg: PgStore, key_id: str | None) -> Principal:
        """The caller of a console session signed in with key ``key_id`` (``None``: made while open).

        :raises AuthenticationError: the key is revoked, expired or gone, or the session was made
            while the instance ran open and it no longer does.
        :raises StoreError: PostgreSQL failed.
        """
        if await self.is_open(pg):
            return ANONYMOUS
        if key_id is None:
            raise AuthenticationError(
                "this session began while the instance was open; sign in with an API key", "session_open"
            )
        row = await self._row(pg, key_id)
        if row is None:
            raise AuthenticationError(f"no valid key has id {key_id}")
        return await self._active(pg, key_id, row)

    async def _active(self, pg: PgStore, key_id: str, row: Any) -> Principal:
        """The principal of ``row``, once it is neither revoked nor expired (marked used)."""
        read_at, _ = self._keys[key_id]
        db_now = row["now"] + timedelta(seconds=time.monotonic() - read_at)
        if row["revoked_at"] is not None:
            raise AuthenticationError(f"the key {key_id} was revoked", "revoked")
        if row["expires_at"] is not None and row["expires_at"] <= db_now:
            raise AuthenticationError(f"the key {key_id} expired", "expired")
        await self._mark_used(pg, key_id)
        return Principal(
            key_id,
            row["name"],
            frozenset(row["scopes"]),
            row["tenant_id"],
            None if row["queues"] is None else frozenset(row["queues"]),
            api_keys.rates_of(row),
            row["expires_at"],
        )

    async def _mark_used(self, pg: PgStore, key_id: str) -> None:
        """``last_used_at`` for a key a request was let through with, at most once per ``ttl``."""
        now = time.monotonic()
        if now - self._marked.get(key_id, -self.ttl) >= self.ttl:
            self._marked[key_id] = now
            await pg.keys.mark_used(key_id)

    async def _row(self, pg: PgStore, key_id: str) -> Any:
        now = time.monotonic()
        cached = self._keys.get(key_id)
        if cached is None or now - cached[0] >= self.ttl:
            if self._pepper is None:  # made with the first key, which may come after this instance started
                self._pepper = await pg.keys.pepper()
            row = await pg.keys.lookup(key_id)
            if len(self._keys) > 10_000:  # made-up ids must not grow the cache without bound
                self._keys.clear()
            self._keys[key_id] = (now, row)
            return row
        return cached[1]
