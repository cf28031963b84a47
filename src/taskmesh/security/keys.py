"""API keys: their form, their scopes, their hashes, and making, rotating and revoking them.

A key is ``tmk_<id>_<secret>``: ``<id>`` (16 characters of base32) names its row in
``api_keys``; ``<secret>`` (48 hex digits, 192 bits) is shown once, at creation, and only
SHA-256 of the deployment's pepper followed by the secret is stored. With that much entropy
a slow hash adds nothing; the pepper (``auth_pepper``, made with the first key) makes a copy
of the hashes alone useless. A presented key is compared in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from taskmesh.errors import InvalidTaskError
from taskmesh.store import PgStore
from taskmesh.tasks.validation import NAME_REGEX

SCOPES = (
    "tasks:read",
    "tasks:write",
    "tasks:cancel",
    "dlq:replay",
    "queues:admin",
    "schedules:admin",
    "workers:read",
    "keys:admin",
    "audit:read",
    "metrics:read",
)
"""Every scope a key may hold (see the README's route table for what each allows)."""
ROLES: dict[str, tuple[str, ...]] = {
    "viewer": ("tasks:read", "workers:read"),
    "operator": ("tasks:read", "tasks:write", "tasks:cancel", "dlq:replay", "queues:admin", "workers:read"),
    "admin": SCOPES,
}
"""Named sets of scopes that ``taskmesh keys create --role`` gives."""
KEY_FORM = re.compile(r"^tmk_([a-z2-7]{16})_([0-9a-f]{48})$")
KEY_ID_FORM = re.compile(r"^[a-z2-7]{16}$")
LIST_MOST = 1000
QUEUES_MOST = 100
QUEUE_NAME = re.compile(NAME_REGEX)


@dataclass(frozen=True)
class NewKey:
    """A key just made: ``key`` is shown once and never stored; ``record`` is its row as listed."""

    key: str
    record: dict[str, Any]


def parse(presented: str) -> tuple[str, str] | None:
    """``(key id, secret)`` of a presented key, ``None`` when it is not of the form ``tmk_<id>_<secret>``."""
    match = KEY_FORM.fullmatch(presented)
    return (match.group(1), match.group(2)) if match else None


def secret_hash(pepper: bytes, secret: str) -> bytes:
    """SHA-256 of the pepper followed by the secret (32 bytes)."""
    return hashlib.sha256(pepper + secret.encode("ascii")).digest()


def matches(pepper: bytes, secret: str, stored: bytes) -> bool:
    """Whether ``secret`` is the one whose hash is ``stored``, compared in constant time."""
    return hmac.compare_digest(secret_hash(pepper, secret), stored)


def check_scopes(scopes: list[str]) -> list[str]:
    """The scopes, deduplicated in the order of :data:`SCOPES`.

    :raises InvalidTaskError: an unknown scope, or none (field ``scopes``).
    """
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise InvalidTaskError("scopes", f"unknown scope {unknown[0]!r}; known: {', '.join(SCOPES)}")
    if not scopes:
        raise InvalidTaskError("scopes", "give at least one scope")
    return [s for s in SCOPES if s in scopes]


def check_queues(queues: list[str]) -> list[str]:
    """The queues, deduplicated and sorted.

    :raises InvalidTaskError: none, more than :data:`QUEUES_MOST`, or a name that is not a queue's
        (field ``queues``).
    """
    if not 1 <= len(queues) <= QUEUES_MOST:
        raise InvalidTaskError("queues", f"give 1 to {QUEUES_MOST} queues")
    for queue in queues:
        if QUEUE_NAME.fullmatch(queue) is None:
            raise InvalidTaskError("queues", f"{queue!r} is not a queue name ([A-Za-z0-9_.:-]{{1,128}})")
    return sorted(set(queues))


RATE_CLASS_NAMES = ("read", "write", "admin")


def check_rate_limits(rates: dict[str, Any]) -> dict[str, float]:
    """A key's own request rates by class, requests per second.

    :raises InvalidTaskError: a class other than read, write, admin, or a rate not in (0, 1,000,000]
        (field ``rate_limits.<class>``).
    """
    out: dict[str, float] = {}
    for name, rate in rates.items():
        if name not in RATE_CLASS_NAMES:
            raise InvalidTaskError(f"rate_limits.{name}", f"unknown class; known: {', '.join(RATE_CLASS_NAMES)}")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1_000_000:
            raise InvalidTaskError(f"rate_limits.{name}", "must be a number of requests per second, 0 < r <= 1000000")
        out[name] = float(rate)
    return out


def rates_of(row: Any) -> dict[str, float] | None:
    """The key row's own rates (``None``: the settings' apply)."""
    raw = row["rate_limits"]
    return None if raw is None else {str(k): float(v) for k, v in json.loads(raw).items()}


def record(row: Any) -> dict[str, Any]:
    """A key's row as the CLI and the API show it (never its hash)."""
    return {
        "key_id": row["id"],
        "name": row["name"],
        "scopes": list(row["scopes"]),
        "tenant_id": row["tenant_id"],
        "queues": None if row["queues"] is None else list(row["queues"]),
        "rate_limits": rates_of(row),
        "expires_at": _iso(row["expires_at"]),
        "revoked_at": _iso(row["revoked_at"]),
        "created_at": _iso(row["created_at"]),
        "last_used_at": _iso(row["last_used_at"]),
    }


def state(row: Any) -> str:
    """``active``, ``revoked`` or ``expired``, for a row of ``key_list`` (which has ``active``)."""
    if row["revoked_at"] is not None:
        return "revoked"
    return "active" if row["active"] else "expired"


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


async def create(
    pg: PgStore,
    name: str,
    scopes: list[str],
    *,
    tenant_id: str | None = None,
    queues: list[str] | None = None,
    expires_at: datetime | None = None,
    rate_limits: dict[str, Any] | None = None,
) -> NewKey:
    """Make a key (and the deployment's pepper, the first time).

    :param name: the principal it belongs to (1..128 characters); several keys may share it.
    :param tenant_id: the one tenant it sees and acts on (``None``: every tenant).
    :param queues: the queues it sees and acts on (``None``: every queue).
    :param rate_limits: its own requests per second by class (``read``, ``write``, ``admin``), instead
        of the settings' (``None``: the settings').
    :raises InvalidTaskError: a bad name, scope, tenant or queue (naming the field).
    :raises StoreError: PostgreSQL failed.
    """
    if not 1 <= len(name) <= 128 or not name.isprintable():
        raise InvalidTaskError("name", "must be 1 to 128 printable characters")
    scopes = check_scopes(scopes)
    if tenant_id is not None and (not 1 <= len(tenant_id) <= 128 or not tenant_id.isprintable()):
        raise InvalidTaskError("tenant_id", "must be 1 to 128 printable characters")
    if queues is not None:
        queues = check_queues(queues)
    rates = None if rate_limits is None else json.dumps(check_rate_limits(rate_limits))
    pepper = await pg.keys.ensure_pepper(secrets.token_bytes(32))
    key_id = base64.b32encode(secrets.token_bytes(10)).decode("ascii").lower()
    secret = secrets.token_hex(24)
    row = await pg.keys.insert(key_id, name, secret_hash(pepper, secret), scopes, tenant_id, queues, expires_at, rates)
    return NewKey(f"tmk_{key_id}_{secret}", record(row))


def is_active(row: Any, now: datetime) -> bool:
    """Whether the key of ``row`` (of ``key_get``) is neither revoked nor expired at ``now``."""
    return row["revoked_at"] is None and (row["expires_at"] is None or row["expires_at"] > now)


def kept_expiry(row: Any, now: datetime) -> datetime | None:
    """The expiry of a key that replaces ``row``'s from ``now``: as long a lifetime as the old key was
    made with (``None``: the old one never expires).

    A rotation is what one does as a key nears its end, so the new key gets the whole lifetime
    again rather than the old key's remaining minutes; a key that expires never rotates into
    one that does not.
    """
    ends: datetime | None = row["expires_at"]
    if ends is None:
        return None
    lifetime: timedelta = ends - row["created_at"]
    return now + lifetime


async def rotate(
    pg: PgStore, key_id: str, overlap: timedelta, *, expires_at: datetime | None = None
) -> tuple[NewKey, str | None]:
    """A new key with ``key_id``'s name, scopes, tenant, queues and rates; the old one ends after
    ``overlap`` (or sooner, at its expiry).

    :param expires_at: the new key's expiry (``None``: the old key's lifetime from now,
        :func:`kept_expiry`; none when the old key has none).
    :returns: the new key, and when the old one now ends (ISO 8601).
    :raises LookupError: no active key has this id (unknown, revoked or expired).
    :raises StoreError: PostgreSQL failed.
    """
    old = await pg.keys.get(key_id)
    now = datetime.now(UTC)
    if old is None or not is_active(old, now):
        raise LookupError(f"no active key has id {key_id}")
    new = await create(
        pg,
        old["name"],
        list(old["scopes"]),
        tenant_id=old["tenant_id"],
        queues=None if old["queues"] is None else list(old["queues"]),
        expires_at=kept_expiry(old, now) if expires_at is None else expires_at,
        rate_limits=rates_of(old),
    )
    ended = await pg.keys.expire_at(key_id, datetime.fromisoformat(new.record["created_at"]) + overlap)
    return new, None if ended is None else _iso(ended["expires_at"])
