"""Sign-in and sign-out: an API key becomes a session cookie, and the cookie ends with sign-out.

The key is checked exactly as the API checks it (:meth:`KeyCache.principal`); it is never stored
or logged, only the session made from it. A sign-in and a refused one are recorded in the audit
log (``console.sign_in``), with the key's id, never its secret. Refused sign-ins spend the client
address's budget of refused authentications as the API's 401s do (:mod:`taskmesh.api.refusals`):
past it the form answers 429 with ``Retry-After``; repeated ones are counted into one summary row.
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.responses import Response

from taskmesh.api import refusals
from taskmesh.api.state import AppState
from taskmesh.console import sessions
from taskmesh.console.redirects import back
from taskmesh.console.web import render, set_session_cookie, state_of, visitor
from taskmesh.errors import AuthenticationError, ForgedRequestError, NotReadyError, RateLimitedError, StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.observability.tracing import trace_id_from_headers
from taskmesh.security import audit
from taskmesh.security import keys as api_keys
from taskmesh.security.audit import AuditEvent

log = get_logger("taskmesh.console")
router = APIRouter(include_in_schema=False)


def _next(value: str | None) -> str:
    """Where to go after sign-in: a console page, never another site."""
    if not value or not value.startswith("/console/") or value.startswith("/console/sign-") or "\\" in value:
        return "/console/overview"
    return value


@router.get("/console/sign-in")
async def sign_in_page(request: Request) -> Response:
    """The sign-in form (an open instance needs none: it goes straight to the overview)."""
    state = state_of(request)
    if state.stores is None:
        raise NotReadyError()
    if await state.keys.is_open(state.stores.pg):
        return back("/console/overview")
    return render(request, None, "sign_in.html", next=_next(request.query_params.get("next")))


@router.post("/console/sign-in")
async def sign_in(
    request: Request, key: Annotated[str, Form(max_length=200)], next: Annotated[str, Form()] = ""
) -> Response:
    """Check ``key`` as the API would and answer with a session cookie, or the form again with why."""
    state = state_of(request)
    if state.stores is None:
        raise NotReadyError()
    pg = state.stores.pg
    if request.headers.get("sec-fetch-site") not in (None, "same-origin", "none"):
        raise ForgedRequestError("Sec-Fetch-Site", "a sign-in from another site is refused")
    sessions.check_origin(request)
    parsed = api_keys.parse(key.strip())
    event = AuditEvent(
        "console.sign_in",
        actor_id=parsed[0] if parsed else None,  # the id only: never the secret
        trace_id=trace_id_from_headers(request.headers),
        client_addr=request.client.host if request.client else None,
        user_agent=request.headers.get("user-agent"),
    )
    try:
        principal = await state.keys.principal(pg, key.strip())
    except AuthenticationError as exc:
        return await _refused(request, state, event, exc, _next(next))
    cookie, session = await sessions.start(pg, principal.key_id, state.console_session_seconds)
    event.actor_type, event.actor_name, event.tenant_id = "key", principal.name, principal.tenant_id
    await _record(state, event)
    log.info("console_signed_in", key_id=principal.key_id, name=principal.name)
    response = back(_next(next))
    set_session_cookie(request, response, cookie, session.expires_at)
    return response


@router.post("/console/sign-out")
async def sign_out(request: Request, csrf_token: Annotated[str, Form()] = "") -> Response:
    """End the session (its row is deleted: a copy of the cookie stops working too)."""
    who = await visitor(request)
    sessions.check_change(request, who.session, csrf_token)
    state = state_of(request)
    if state.stores is None:  # the instance is stopping
        raise NotReadyError()
    await sessions.end(state.stores.pg, who.cookie)
    principal = who.principal
    await _record(
        state,
        AuditEvent(
            "console.sign_out",
            actor_type="key" if principal.key_id is not None else "anonymous",
            actor_id=principal.key_id,
            actor_name=principal.name,
            tenant_id=principal.tenant_id,
            trace_id=trace_id_from_headers(request.headers),
            client_addr=request.client.host if request.client else None,
            user_agent=request.headers.get("user-agent"),
        ),
    )
    log.info("console_signed_out", key_id=principal.key_id, name=principal.name)
    response = back("/console/sign-in", notice="Signed out.")
    response.delete_cookie(sessions.COOKIE, path="/")
    return response


async def _refused(request: Request, state: AppState, event: AuditEvent, exc: AuthenticationError, to: str) -> Response:
    """The form again with why (401), or 429 once the address spent its budget of refused sign-ins; the
    refusal is recorded (or counted, when it repeats: :mod:`taskmesh.api.denials`)."""
    event.outcome, event.status, event.details["refused"] = "denied", 401, exc.reason
    try:
        await refusals.count(state, event.client_addr, exc)
    except RateLimitedError as limited:
        event.status, event.details["throttled"] = 429, True
        await _record(state, event)
        page = render(request, None, "sign_in.html", 429, next=to, refused=str(limited))
        page.headers["Retry-After"] = str(max(1, math.ceil(limited.retry_after)))
        return page
    await _record(state, event)
    return render(request, None, "sign_in.html", 401, next=to, refused=str(exc))


async def _record(state: AppState, event: AuditEvent) -> None:
    """The sign-in's or sign-out's audit row, on the pool (there is no change to share a transaction
    with); a refusal repeated within its window is only counted."""
    if event.outcome == "denied" and not state.denials.admit(event):
        return
    if state.stores is not None:
        try:
            await audit.write(state.stores.pg, event)
        except StoreError as exc:
            log.warning("audit_unwritten", action=event.action, error=str(exc))
    audit.emit(event)
