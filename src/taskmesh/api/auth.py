"""Who is calling: the API key of a request, its scopes, and each route's guard.

Every ``/api/v1`` route declares the scope it needs with :func:`require`; the guard
reads ``Authorization: Bearer tmk_…`` (or ``X-API-Key``), finds the key through a
:class:`KeyCache` and refuses with 401 (no usable key) or 403 (a key without the
scope). The cache keeps a key's row for ``KEY_CACHE_SECONDS``, so a revoked or
expired key stops working on every instance within that time, and marks the key used
each time it reads it again (``last_used_at``, at most once per period per instance).

An instance runs *open* (every request is allowed, as ``anonymous``) when
``auth = "none"``, or while it listens on a loopback address and no key was ever made:
the dev profile and a first start work before any key is made, and the first key made
closes it within the cache period for good (revoking every key does not open it again).
A non-loopback instance with ``auth = "keys"`` never runs open (:func:`taskmesh.api.policy.may_serve`:
the supervisor refuses to start it without a key).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from taskmesh.api import refusals
from taskmesh.api.principals import ANONYMOUS, RATE_CLASSES, Principal, RatePolicy
from taskmesh.api.state import AppState
from taskmesh.console import sessions
from taskmesh.errors import (
    AuthenticationError,
    BeyondReachError,
    NotReadyError,
    PermissionDeniedError,
    RateLimitedError,
    StoreError,
)
from taskmesh.observability.logs import get_logger
from taskmesh.security import keys as api_keys
from taskmesh.security.tenancy import Reach

log = get_logger("taskmesh.auth")

_bearer = HTTPBearer(auto_error=False, description="An API key, `tmk_<id>_<secret>`")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="An API key, `tmk_<id>_<secret>`")


def _get_state(request: Request) -> AppState:
    state: AppState = request.app.state.taskmesh
    return state


SCOPE_OF: dict[Callable[..., Awaitable[Principal]], str] = {}
"""Each guard made by :func:`require` and its scope (the OpenAPI document names it per route)."""


def require(scope: str) -> Callable[..., Awaitable[Principal]]:
    """A route dependency: the caller, once it holds ``scope``; also kept on ``request.state.principal``.

    :raises ValueError: ``scope`` is not one of :data:`taskmesh.security.keys.SCOPES` (a programming error).
    """
    if scope not in api_keys.SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    async def guard(
        request: Request,
        state: Annotated[AppState, Depends(_get_state)],
        bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
        header: Annotated[str | None, Security(_header)],
    ) -> Principal:
        return await authenticate(request, state, scope, bearer.credentials if bearer is not None else header)

    SCOPE_OF[guard] = scope
    return guard


async def authenticate(request: Request, state: AppState, scope: str, presented: str | None = None) -> Principal:
    """The request's caller, once it holds ``scope``; ``presented`` defaults to the request's own key.

    :raises NotReadyError: the stores have not answered yet (503).
    :raises AuthenticationError: no usable key (401).
    :raises RateLimitedError: no usable key, from an address past its budget of refusals (429,
        :mod:`taskmesh.api.refusals`), or a key past its rate (429).
    :raises PermissionDeniedError: a key without ``scope`` (403).
    """
    if state.stores is None:
        raise NotReadyError()
    if presented is None:
        presented = presented_key(request)
    cookie = request.cookies.get(sessions.COOKIE) if presented is None else None
    try:
        if cookie is not None:
            principal = await _session_principal(request, state, cookie)
        else:
            principal = await state.keys.principal(state.stores.pg, presented)
    except AuthenticationError as exc:
        await refusals.count(state, request.client.host if request.client else None, exc)
        raise
    request.state.principal = principal  # also for a refusal below: the audit log names the key
    if principal.key_id is not None:
        await _spend(state, principal, RATE_CLASSES[scope])
    if not principal.allows(scope):
        raise PermissionDeniedError(scope)
    return principal


async def _session_principal(request: Request, state: AppState, cookie: str) -> Principal:
    """The caller of a request made with a console session's cookie (and no key).

    :raises AuthenticationError: the session is unknown or over, or its key no longer works (401).
    :raises ForgedRequestError: a change without the session's CSRF token, or from another site (403).
    """
    assert state.stores is not None
    pg = state.stores.pg
    session = await sessions.find(pg, cookie)
    if session is None:
        if await state.keys.is_open(pg):
            return ANONYMOUS
        raise AuthenticationError("the console session is over: sign in again at /console/sign-in", "session_over")
    sessions.check_change(request, session, request.headers.get(sessions.CSRF_HEADER))
    return await state.keys.principal_of_key(pg, session.key_id)


async def _spend(state: AppState, principal: Principal, name: str) -> None:
    """One request of class ``name`` against the key's budget, and against its tenant's when the tenant's
    quota sets one (``read_per_second``, ...), each shared by every instance through Redis.

    The key's own rate of the class (``rate_limits``) wins over the settings'. A tenant's budget
    holds however many keys the tenant has.

    A Redis that does not answer lets the request through (logged as ``rate_limit_unchecked``, at
    most once per 10 s with the count of requests it stands for): the limit protects the
    platform, and refusing everything during an outage would not.

    :raises RateLimitedError: a budget is spent (429).
    """
    key_id = principal.key_id
    own = (principal.rate_limits or {}).get(name)
    policy = state.rate_policies.get(name) if own is None else RatePolicy.of(own, state.rate_burst_seconds)
    if state.stores is None or key_id is None:
        return
    if policy is not None:
        await _spend_bucket(state, f"{name}:{key_id}", f"the key {key_id}", name, policy)
    quota = None if principal.tenant_id is None else state.quotas.of(principal.tenant_id)
    tenant_rate = None if quota is None else getattr(quota, f"{name}_per_second")
    if tenant_rate is not None:
        tenant_policy = RatePolicy.of(tenant_rate, state.rate_burst_seconds)
        await _spend_bucket(
            state, f"{name}:tenant:{principal.tenant_id}", f"tenant {principal.tenant_id!r}", name, tenant_policy
        )


async def _spend_bucket(state: AppState, bucket: str, who: str, name: str, policy: RatePolicy) -> None:
    assert state.stores is not None
    try:
        allowed, _, retry_after, reset = await state.stores.redis.limits.rate_limit(
            bucket, policy.per_second, policy.burst
        )
    except StoreError as exc:
        state.rate_unchecked.record(bucket=bucket, error=str(exc))
        return
    if not allowed:
        raise RateLimitedError(
            f"{who} made more than {policy.per_second:g} {name} requests per second "
            f"(bursts of {policy.burst}); retry in {max(retry_after, 0.1):.1f} s",
            name,
            policy.header(name),
            retry_after,
            reset,
        )


def presented_key(request: Request) -> str | None:
    """The key of ``Authorization: Bearer …``, else of ``X-API-Key``, else ``None``."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("x-api-key") or None


def caller(request: Request) -> Principal:
    """The principal the route's guard let through (:data:`ANONYMOUS` on a route without a guard)."""
    principal: Principal = getattr(request.state, "principal", ANONYMOUS)
    return principal


def demand(request: Request, scope: str) -> None:
    """Refuse the request unless its caller holds ``scope`` (for an action chosen in the body).

    :raises PermissionDeniedError: the caller lacks it (403).
    """
    if not caller(request).allows(scope):
        raise PermissionDeniedError(scope)


def reach_of(request: Request) -> Reach:
    """The tenant and queues the request's caller sees and acts on."""
    return caller(request).reach


def platform_wide(request: Request, scope: str, what: str, *, every_queue: bool = False) -> None:
    """Refuse a tenant-bound caller a view or action that spans every tenant (queue depths, workers).

    :param every_queue: the view spans every queue too (workers, metrics): a queue-bound key is refused.
    :raises PermissionDeniedError: the caller's key is bound to a tenant (or to queues) (403).
    """
    principal = caller(request)
    if principal.tenant_id is not None:
        raise PermissionDeniedError(
            scope, f"{what} covers every tenant; this key is bound to tenant {principal.tenant_id!r}"
        )
    if every_queue and principal.queues is not None:
        raise PermissionDeniedError(scope, f"{what} covers every queue; this key is bound to some queues")


def check_queue_reach(request: Request, queue: str, field: str = "queue") -> None:
    """Refuse a queue beyond the caller's queues.

    :raises BeyondReachError: the caller's key is bound to other queues (403 naming ``field``).
    """
    queues = caller(request).queues
    if queues is not None and queue not in queues:
        raise BeyondReachError(field, f"this key may use the queues {', '.join(sorted(queues))}; not {queue!r}")
