"""What a key may hand out: a key made or rotated over the API holds no more than the key that asked.

A caller with ``keys:admin`` makes keys (``POST /api/v1/keys``) and rotates them
(``POST /api/v1/keys/{key_id}/rotate``). Either way the key it gets back may hold only:

- scopes the caller holds;
- the caller's tenant and some of its queues (a new key without them gets the caller's);
- per class (``read``, ``write``, ``admin``) a rate no higher than the caller's own rate of
  the class (its ``rate_limits``, else the settings'); a new key without a rate of a class
  the caller has a lower rate of than the settings' gets the caller's;
- an expiry no later than the caller's own (a new key without one gets the caller's).

A rotated key keeps the grants of the key it replaces, so those must be within the caller's;
its expiry keeps the old key's lifetime from now (see :func:`taskmesh.security.keys.kept_expiry`)
unless the body sets one. Whatever is beyond the caller is refused (403 problem+json naming the
field), never cut down in silence. A caller of an open instance (anonymous) holds every scope
and has no rate limit or expiry: it is bounded by nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from taskmesh.api.principals import Principal, RatePolicy
from taskmesh.errors import BeyondReachError
from taskmesh.security import keys as api_keys


def scopes_within(principal: Principal, scopes: list[str]) -> None:
    """Refuse scopes the caller does not hold.

    :raises BeyondReachError: a known scope the caller lacks (403 naming ``scopes``).
    """
    missing = [s for s in dict.fromkeys(scopes) if s in api_keys.SCOPES and not principal.allows(s)]
    if missing:
        raise BeyondReachError("scopes", f"this key cannot give scopes it does not hold: {', '.join(missing)}")


def reach_within(
    principal: Principal, tenant_id: str | None, queues: list[str] | None
) -> tuple[str | None, list[str] | None]:
    """The new key's tenant and queues: the caller's when not given, refused when beyond them.

    :raises BeyondReachError: another tenant, or a queue beyond the caller's (403 naming the field).
    """
    if principal.tenant_id is not None:
        if tenant_id is not None and tenant_id != principal.tenant_id:
            raise BeyondReachError(
                "tenant_id", f"this key is bound to tenant {principal.tenant_id!r}; not {tenant_id!r}"
            )
        tenant_id = principal.tenant_id
    if principal.queues is not None:
        beyond = sorted(set(queues or ()) - principal.queues)
        if beyond:
            raise BeyondReachError(
                "queues", f"this key may use the queues {', '.join(sorted(principal.queues))}; not {beyond[0]!r}"
            )
        queues = queues or sorted(principal.queues)
    return tenant_id, queues


def caller_rates(principal: Principal, policies: Mapping[str, RatePolicy]) -> dict[str, float] | None:
    """The caller's rate of each class, requests per second (``None``: an open instance's caller, unlimited)."""
    if principal.key_id is None:
        return None
    own = principal.rate_limits or {}
    return {name: own.get(name, policies[name].per_second) for name in api_keys.RATE_CLASS_NAMES if name in policies}


def rates_within(
    principal: Principal,
    policies: Mapping[str, RatePolicy],
    rates: dict[str, float] | None,
    *,
    fill: bool,
) -> dict[str, float] | None:
    """A key's own rates (``None``: the settings'), checked against the caller's.

    :param rates: the rates asked for (create) or held by the key being rotated, already
        checked by :func:`taskmesh.security.keys.check_rate_limits`.
    :param fill: a class without a rate whose settings' rate is above the caller's gets the
        caller's (create); otherwise that is refused (rotate: the new key must equal the old).
    :raises BeyondReachError: a rate above the caller's (403 naming ``rate_limits.<class>``).
    """
    bound = caller_rates(principal, policies)
    if bound is None:
        return rates
    out = dict(rates or {})
    for name, most in bound.items():
        given = out.get(name)
        rate = given if given is not None else policies[name].per_second
        if rate <= most:
            continue
        if given is None and fill:
            out[name] = most
            continue
        whose = "" if given is not None else "the settings' rate, "
        raise BeyondReachError(
            f"rate_limits.{name}",
            f"{whose}{rate:.7g} {name} requests per second, is above this key's own rate ({most:.7g}); "
            "a key cannot give a rate above its own",
        )
    return out if out or rates is not None else None


def expiry_within(principal: Principal, expires_at: datetime | None, *, asked: bool) -> datetime | None:
    """The new key's expiry, no later than the caller's own.

    :param expires_at: the expiry asked for, or the one the key would get (``None``: never).
    :param asked: the body set ``expires_at``: beyond the caller's it is refused, not shortened.
    :raises BeyondReachError: an asked expiry after the caller's (403 naming ``expires_in_seconds``).
    """
    ends = principal.expires_at
    if ends is None or (expires_at is not None and expires_at <= ends):
        return expires_at
    if asked:
        raise BeyondReachError(
            "expires_in_seconds",
            f"this key expires at {ends.isoformat()}; it cannot give a key that outlives it",
        )
    return ends
