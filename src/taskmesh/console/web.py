"""What every console page shares: the templates and who is looking (the headers: ``guard.py``).

A page finds its :class:`Visitor` through :func:`visitor`: the session of the request's cookie,
acting as its API key (:mod:`taskmesh.console.sessions`). On an open instance a first visit gets
a session without a key at once; elsewhere a visitor without a working session is sent to the
sign-in page. Templates are autoescaped Jinja2 (``console/templates``): a task's name, payload,
error or a schedule's name can never become markup.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from taskmesh.api.principals import Principal
from taskmesh.api.state import AppState
from taskmesh.console import sessions
from taskmesh.console.guard import SignInNeeded
from taskmesh.console.redirects import FLASH, back
from taskmesh.errors import AuthenticationError, NotReadyError

if TYPE_CHECKING:  # the API client imports this module (its Visitor)
    from taskmesh.console.api_client import Answer

templates = Environment(
    loader=PackageLoader("taskmesh.console", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)

ID_TAIL = 12
"""Hex digits of a task id shown in lists: its last group."""


def id_tail(task_id: str) -> str:
    """The part of a task id that tells it from its neighbours: its last :data:`ID_TAIL` hex digits.

    A UUIDv7 begins with its creation time in milliseconds, so the ids of tasks made in the same
    minute share their first 8 hex digits; the last group is 48 random bits. A value that is not
    a UUID's text is returned whole.
    """
    return task_id[-ID_TAIL:] if len(task_id) == 36 and task_id.count("-") == 4 else task_id


templates.filters["id_tail"] = id_tail


@dataclass
class Visitor:
    """Who is looking at a console page: the session's cookie, the session and its principal.

    :ivar cookie: the session cookie's secret (forwarded to the API on the visitor's behalf).
    :ivar new_cookie: a session made by this request (an open instance's first visit): set it.
    :ivar open: the instance runs open (no key is needed: the pages say so).
    """

    cookie: str
    session: sessions.Session
    principal: Principal
    open: bool
    new_cookie: bool = False

    def can(self, scope: str) -> bool:
        """Whether the visitor's key holds ``scope`` (actions it lacks are not offered)."""
        return self.principal.allows(scope)


def state_of(request: Request) -> AppState:
    """The instance's shared state."""
    state: AppState = request.app.state.taskmesh
    return state


async def visitor(request: Request) -> Visitor:
    """The visitor of a console page.

    :raises SignInNeeded: no session, an ended one, or one whose key no longer works.
    :raises NotReadyError: the stores have not answered yet (503).
    :raises StoreError: PostgreSQL failed.
    """
    state = state_of(request)
    if state.stores is None:
        raise NotReadyError()
    pg = state.stores.pg
    cookie = request.cookies.get(sessions.COOKIE)
    session = await sessions.find(pg, cookie)
    is_open = await state.keys.is_open(pg)
    if session is None or cookie is None:
        if not is_open:
            raise SignInNeeded("your session ended; sign in again" if cookie else None)
        cookie, session = await sessions.start(pg, None, state.console_session_seconds)
        return Visitor(cookie, session, await state.keys.principal_of_key(pg, None), True, new_cookie=True)
    try:
        principal = await state.keys.principal_of_key(pg, session.key_id)
    except AuthenticationError as exc:
        raise SignInNeeded(str(exc)) from None
    return Visitor(cookie, session, principal, is_open)


def set_session_cookie(request: Request, response: Response, cookie: str, expires_at: datetime) -> None:
    """The session cookie: HttpOnly, SameSite=Strict, Secure when the page came over HTTPS (or a proxy's
    ``X-Forwarded-Proto`` says it did)."""
    response.set_cookie(
        sessions.COOKIE,
        cookie,
        max_age=max(1, round((expires_at - datetime.now(UTC)).total_seconds())),
        path="/",
        httponly=True,
        samesite="strict",
        # Behind a proxy that ends TLS (deploy/nginx), the page came over HTTPS if the proxy says so. A
        # client claiming it can only make its own cookie stricter, so the header is trusted here.
        secure=request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https",
    )


def render(
    request: Request,
    who: Visitor | None,
    template: str,
    status: int = 200,
    *,
    api_refusal: Answer | None = None,
    **context: Any,
) -> Response:
    """The page ``template`` for ``who``, with the layout's context (its key, the nav, the notice).

    :param api_refusal: the API's refusal the page shows (:func:`~taskmesh.console.api_client.refusal`): the
        page answers with its status (and its ``Retry-After``) instead of ``status``.
    """
    if api_refusal is not None:
        status = api_refusal.status
    flash = _read_flash(request.cookies.get(FLASH))
    page = templates.get_template(template).render(
        who=who,
        path=request.url.path,
        query_string=request.url.query,
        notice=flash.get("notice"),
        problem=flash.get("problem"),
        **context,
    )
    response = HTMLResponse(page, status_code=status)
    if api_refusal is not None and api_refusal.retry_after is not None:
        response.headers["retry-after"] = api_refusal.retry_after
    if flash:
        response.delete_cookie(FLASH, path="/console")
    if who is not None and who.new_cookie:
        set_session_cookie(request, response, who.cookie, who.session.expires_at)
    return response


REFUSALS = (401, 403, 429)
"""The API's answers that an action's page answers with as they are (the key may not, or not now)."""


def failed(request: Request, who: Visitor, page: str, what: str, answer: Answer) -> Response:
    """An action the API refused: a key lacking the scope or reach (401, 403) or past its rate limit (429,
    with ``Retry-After``) gets that status and a page saying so; anything else (a 409, a 422) goes back to
    ``page`` with the problem."""
    if answer.status in REFUSALS:
        message, retry = answer.problem, answer.retry_after
        return render(
            request, who, "refused.html", api_refusal=answer, what=what, message=message, page=page, retry=retry
        )
    return back(page, problem=f"{what}: {answer.problem}")


def _read_flash(value: str | None) -> dict[str, str]:
    if not value or len(value) > 2048:
        return {}
    try:
        flash = orjson.loads(base64.urlsafe_b64decode(value.encode()))
    except (ValueError, orjson.JSONDecodeError):
        return {}
    if not isinstance(flash, dict):
        return {}
    return {k: str(v) for k, v in flash.items() if k in ("notice", "problem")}
