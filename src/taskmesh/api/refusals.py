"""Refused authentication, limited per client address: what a client guessing keys gets past its budget.

Each request refused for its key or session (401) and each refused console sign-in spends one
from its client address's budget (an IPv6 address by its /64), shared by every instance in
Redis with the same GCRA script as the keys' rate limits (``{prefix}:ratelimit:auth-refused:<address>``):
``auth_refusals_per_minute`` (60) a minute, all of them at once after a quiet spell. Past it the
refusal answers 429 problem+json with ``Retry-After`` instead of 401 (``policy: "auth"``); a
request with a working key is never counted nor refused here, so a client behind the same
address or proxy with a good key is not locked out.

While Redis does not answer, refusals answer 401 as before (not 429; nothing crashes), and
``auth_refusals_unchecked`` is logged at most once per 10 s with the count it stands for; the
audit log stays bounded either way (:mod:`taskmesh.api.denials` counts in memory).
"""

from __future__ import annotations

from taskmesh.api.denials import client_network
from taskmesh.api.state import AppState
from taskmesh.errors import AuthenticationError, RateLimitedError, StoreError
from taskmesh.security import audit

POLICY_NAME = "auth"
"""The policy's name in ``RateLimit-Policy`` and in the problem's ``policy``."""


async def count(state: AppState, client_addr: str | None, refusal: AuthenticationError) -> None:
    """Spend one refused authentication from ``client_addr``'s budget; noted on the current audit event.

    :raises RateLimitedError: the address spent its budget (429 with ``Retry-After``).
    """
    audit.note(details={"refused": refusal.reason})
    policy = state.auth_refusals
    if policy is None or state.stores is None:
        return
    network = client_network(client_addr)
    try:
        allowed, _, retry_after, reset = await state.stores.redis.limits.rate_limit(
            f"auth-refused:{network}", policy.per_second, policy.burst
        )
    except StoreError as exc:
        state.refusals_unchecked.record(error=str(exc))
        return
    if allowed:
        return
    audit.note(details={"throttled": True})
    raise RateLimitedError(
        f"more than {policy.burst} refused authentications from {network} in "
        f"{round(policy.burst / policy.per_second)} s; retry in {max(retry_after, 0.1):.1f} s",
        POLICY_NAME,
        policy.header(POLICY_NAME),
        retry_after,
        reset,
    )
