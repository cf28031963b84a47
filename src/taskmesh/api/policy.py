"""The API's serving policy: who may call it (keys, rate limits, quotas) and whether it may serve at all.

The supervisor builds the API's :class:`~taskmesh.api.state.AppState` with :func:`app_state` and asks
:func:`may_serve` once the stores answer: a non-loopback instance with ``auth = "keys"`` and no
active key would serve everyone's tasks to no one, so it stops with :data:`NO_KEY` instead.
"""

from __future__ import annotations

import ipaddress

from taskmesh.api.principals import KeyCache, RatePolicy
from taskmesh.api.quotas import Quotas
from taskmesh.api.state import AppState, ServedQueues
from taskmesh.config import Settings
from taskmesh.observability.logs import get_logger
from taskmesh.observability.metrics import Metrics
from taskmesh.services.base import call_until_done
from taskmesh.store import Stores
from taskmesh.store.schema_watch import SchemaWatch

log = get_logger("taskmesh.api.policy")

NO_KEY = (
    "auth: the API listens on {host}, which is not a loopback address, and no active API key exists: make one "
    "with `taskmesh keys create --name admin --role admin` (it talks to DATABASE_URL directly), or set "
    'auth = "none" (TASKMESH_AUTH=none) to serve without keys'
)
"""The configuration error of an instance that may not serve (format it with ``host``)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def rate_policies(settings: Settings) -> dict[str, RatePolicy]:
    """The per-key rate limits of the settings, by class (``read``, ``write``, ``admin``)."""
    rates = {
        "read": settings.rate_limit_read_per_second,
        "write": settings.rate_limit_write_per_second,
        "admin": settings.rate_limit_admin_per_second,
    }
    return {name: RatePolicy.of(rate, settings.rate_limit_burst_seconds) for name, rate in rates.items()}


def app_state(settings: Settings, metrics: Metrics, own_names: list[str] | None) -> AppState:
    """The API's state for an instance of ``settings``: its keys, rate limits, quotas and served queues.

    :param own_names: the task names this instance has handlers for; ``None``: any (a fallback handler).
    """
    own = frozenset(settings.queue_names) if settings.workers_enabled else frozenset[str]()
    return AppState(
        metrics=metrics,
        queues=list(settings.queue_names),
        served=ServedQueues(own=own, own_names=None if own_names is None else frozenset(own_names)),
        keys=KeyCache(
            enforce=settings.auth == "keys", loopback=not settings.http_enabled or is_loopback(settings.http_host)
        ),
        metrics_protected=settings.metrics_auth == "scope",
        rate_policies=rate_policies(settings),
        rate_burst_seconds=settings.rate_limit_burst_seconds,
        auth_refusals=RatePolicy.of(settings.auth_refusals_per_minute / 60, 60.0),
        quotas=Quotas(settings.tenant_quotas, settings.tenant_quota_default, settings.rate_limit_burst_seconds),
        console_session_seconds=settings.console_session_hours * 3600,
        schema=SchemaWatch(settings.schema_error_window_seconds, count=metrics.schema_mismatched),
    )


async def may_serve(settings: Settings, state: AppState, stores: Stores) -> bool:
    """``False`` for an instance that would serve others with keys required and no key to use.

    Says at start when the API is open: ``auth_disabled`` (``auth = "none"``), or ``auth_open``
    (loopback, no key yet; logged by the key cache, and ``auth_enforced`` once a key exists).
    Asks PostgreSQL through its outages (it returns once it has an answer).
    """
    if not (settings.api_enabled and settings.http_enabled):  # a worker-only instance serves no API
        return True
    if settings.auth != "keys":
        log.warning("auth_disabled", setting='auth = "none"', http=settings.http_host)
        return True
    any_key: list[bool] = []

    async def look() -> None:
        if state.keys.loopback:
            await state.keys.is_open(stores.pg)
            any_key.append(True)
        else:
            any_key.append(await stores.pg.keys.any_active())

    await call_until_done("postgres", look)
    return any_key[0]
