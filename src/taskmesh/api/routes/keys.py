"""Key routes: API keys managed over the API with ``keys:admin``, as ``taskmesh keys`` does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field, StrictFloat
from starlette.responses import Response

from taskmesh.api import key_grants
from taskmesh.api.auth import caller, reach_of, require
from taskmesh.api.deps import StateDep, StoresDep, body_schema, json_response, parse_body
from taskmesh.api.problems import problem, problem_responses
from taskmesh.api.schemas import Key, KeyList, NewKey, RotatedKey
from taskmesh.errors import InvalidTaskError
from taskmesh.security import audit
from taskmesh.security import keys as api_keys
from taskmesh.store import PgStore

router = APIRouter()

KeyIdPath = Annotated[
    str, Path(description="A key's id (the 16 characters after tmk_).", json_schema_extra={"pattern": "^[a-z2-7]{16}$"})
]
YEAR_SECONDS = 366 * 86400 * 10


class CreateKey(BaseModel):
    """Body of ``POST /api/v1/keys``: a name, and scopes or a role (or both: the union)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    scopes: list[str] = Field(default_factory=list, max_length=len(api_keys.SCOPES))
    role: str | None = Field(default=None, pattern="^(viewer|operator|admin)$")
    expires_in_seconds: int | None = Field(default=None, gt=0, le=YEAR_SECONDS)
    tenant_id: str | None = Field(default=None, min_length=1, max_length=128)
    queues: list[str] | None = Field(default=None, min_length=1, max_length=api_keys.QUEUES_MOST)
    rate_limits: dict[str, StrictFloat] | None = Field(
        default=None, description="Requests per second by class (read, write, admin), instead of the settings'."
    )


class RotateKey(BaseModel):
    """Body of ``POST /api/v1/keys/{key_id}/rotate`` (optional)."""

    model_config = ConfigDict(extra="forbid")

    overlap_seconds: int = Field(default=86400, ge=0, le=YEAR_SECONDS)
    expires_in_seconds: int | None = Field(default=None, gt=0, le=YEAR_SECONDS)


def _key_id(key_id: str) -> str:
    if api_keys.KEY_ID_FORM.fullmatch(key_id) is None:
        raise InvalidTaskError("key_id", "must be the 16 characters of a key's id (a-z, 2-7)")
    return key_id


def _not_found(key_id: str) -> Response:
    return problem(404, "Key not found", f"no active key has id {key_id}")


async def _reaches(request: Request, stores: Any, key_id: str) -> bool:
    """Whether the key exists and is bound within the caller's tenant and queues."""
    reach = reach_of(request)
    if reach.unlimited:
        return True
    row = await stores.pg.keys.get(key_id)
    return row is not None and reach.covers(row["tenant_id"], row["queues"])


def _expiry(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.now(UTC) + timedelta(seconds=seconds)


@router.get(
    "/api/v1/keys",
    operation_id="listKeys",
    tags=["keys"],
    response_model=KeyList,
    dependencies=[Depends(require("keys:admin"))],
    responses=problem_responses(),
    summary="Every API key, newest first: name, scopes, state, expiry, last use (never a secret or hash)",
)
async def list_keys(request: Request, stores: StoresDep) -> Response:
    """Up to 1,000 keys, each with ``state``: ``active``, ``revoked`` or ``expired`` (a key bound to a tenant
    or queues: the keys bound within them)."""
    reach = reach_of(request)
    rows = [r for r in await stores.pg.keys.list(api_keys.LIST_MOST) if reach.covers(r["tenant_id"], r["queues"])]
    return json_response({"keys": [{**api_keys.record(r), "state": api_keys.state(r)} for r in rows]})


@router.post(
    "/api/v1/keys",
    operation_id="createKey",
    tags=["keys"],
    response_model=NewKey,
    status_code=201,
    dependencies=[Depends(require("keys:admin"))],
    responses=problem_responses(400, 413, 422),
    openapi_extra=body_schema(CreateKey),
    summary="Make an API key: 201 with the key, shown this once",
)
async def create_key(request: Request, stores: StoresDep, state: StateDep) -> Response:
    """Make a key with ``scopes`` and/or a ``role``'s; ``key`` in the answer is never shown again.

    A key cannot make a key that can do more than itself: only scopes it holds, within its own
    tenant and queues, at rates no higher than its own and expiring no later than itself (each
    filled in from the caller when the body has none; see ``api/key_grants.py``)."""
    req = await parse_body(request, CreateKey)
    scopes = [*api_keys.ROLES.get(req.role or "", ()), *req.scopes]
    who = caller(request)
    key_grants.scopes_within(who, scopes)
    tenant_id, queues = key_grants.reach_within(who, req.tenant_id, req.queues)
    rates = None if req.rate_limits is None else api_keys.check_rate_limits(req.rate_limits)
    rates = key_grants.rates_within(who, state.rate_policies, rates, fill=True)
    asked = _expiry(req.expires_in_seconds)
    expires_at = key_grants.expiry_within(who, asked, asked=asked is not None)
    async with stores.pg.changing() as pg:
        new = await _create(pg, req, scopes, tenant_id, queues, rates, expires_at)
    return json_response({"key": new.key, **new.record, "state": "active"}, 201)


async def _create(
    pg: PgStore,
    req: CreateKey,
    scopes: list[str],
    tenant_id: str | None,
    queues: list[str] | None,
    rates: dict[str, float] | None,
    expires_at: datetime | None,
) -> api_keys.NewKey:
    new = await api_keys.create(
        pg, req.name, scopes, tenant_id=tenant_id, queues=queues, expires_at=expires_at, rate_limits=rates
    )
    audit.note(
        resource_type="key",
        resource_id=new.record["key_id"],
        details={"name": req.name, "scopes": new.record["scopes"], "tenant_id": tenant_id, "queues": queues},
    )
    return new


@router.post(
    "/api/v1/keys/{key_id}/revoke",
    operation_id="revokeKey",
    tags=["keys"],
    response_model=Key,
    dependencies=[Depends(require("keys:admin"))],
    responses=problem_responses(404, 422),
    summary="Revoke a key: every instance refuses it within 5 seconds",
)
async def revoke_key(key_id: KeyIdPath, request: Request, stores: StoresDep) -> Response:
    """The key, revoked (kept for the record); 404 when no key has this id (or none within the caller's reach)."""
    if not await _reaches(request, stores, _key_id(key_id)):
        return problem(404, "Key not found", f"no key has id {key_id}")
    async with stores.pg.changing() as pg:
        row = await pg.keys.revoke(key_id)
    if row is None:
        return problem(404, "Key not found", f"no key has id {key_id}")
    return json_response({**api_keys.record(row), "state": "revoked"})


@router.post(
    "/api/v1/keys/{key_id}/rotate",
    operation_id="rotateKey",
    tags=["keys"],
    response_model=RotatedKey,
    status_code=201,
    dependencies=[Depends(require("keys:admin"))],
    responses=problem_responses(400, 404, 413, 422),
    openapi_extra=body_schema(RotateKey, required=False),
    summary="A new key like this one; the old one ends after overlap_seconds (default a day)",
)
async def rotate_key(key_id: KeyIdPath, request: Request, stores: StoresDep, state: StateDep) -> Response:
    """201 with the new key (shown this once), ``replaces`` and ``replaced_key_expires_at``; 404 for a key
    that is unknown, revoked or expired.

    The new key holds what the old one held, so the caller must hold all of it (scopes, tenant,
    queues, rates; 403 naming the field otherwise). It keeps the old key's lifetime from now
    unless ``expires_in_seconds`` sets another, and ends no later than the caller's own key."""
    req = await parse_body(request, RotateKey, optional=True)
    old = await stores.pg.keys.get(_key_id(key_id))
    now = datetime.now(UTC)
    if old is None or not reach_of(request).covers(old["tenant_id"], old["queues"]) or not api_keys.is_active(old, now):
        return _not_found(key_id)
    who = caller(request)
    key_grants.scopes_within(who, list(old["scopes"]))
    key_grants.rates_within(who, state.rate_policies, api_keys.rates_of(old), fill=False)
    asked = _expiry(req.expires_in_seconds)
    expires_at = key_grants.expiry_within(
        who, api_keys.kept_expiry(old, now) if asked is None else asked, asked=asked is not None
    )
    try:
        async with stores.pg.changing() as pg:
            new, ends = await api_keys.rotate(pg, key_id, timedelta(seconds=req.overlap_seconds), expires_at=expires_at)
            audit.note(details={"new_key_id": new.record["key_id"]})
    except LookupError:
        return _not_found(key_id)
    answer: dict[str, Any] = {**new.record, "state": "active", "replaces": key_id, "replaced_key_expires_at": ends}
    return json_response({"key": new.key, **answer}, 201)
