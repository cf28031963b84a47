"""The console's redirects: back to a page with a one-time notice, and to the sign-in page.

Light on purpose: the app's sign-in handler (:mod:`taskmesh.console.guard`) needs it from the
start, before the pages load.
"""

from __future__ import annotations

import base64
from urllib.parse import quote, urlsplit

import orjson
from starlette.requests import Request
from starlette.responses import RedirectResponse

FLASH = "tm_flash"
"""A one-time notice or problem for the next page (a cookie, so no link can plant a message)."""


def back(to: str, *, notice: str | None = None, problem: str | None = None) -> RedirectResponse:
    """303 to the console page ``to`` (a path under ``/console``), with a one-time notice or problem."""
    if (not to.startswith("/console/") and to != "/console") or "\\" in to or "/.." in to:
        to = "/console"  # only this console's own pages: never another site
    response = RedirectResponse(to, status_code=303)
    flash = {k: v[:500] for k, v in (("notice", notice), ("problem", problem)) if v}
    if flash:
        value = base64.urlsafe_b64encode(orjson.dumps(flash)).decode()
        response.set_cookie(FLASH, value, max_age=60, path="/console", httponly=True, samesite="strict")
    return response


def to_sign_in(request: Request, why: str | None) -> RedirectResponse:
    """303 to the sign-in page, which then returns to this page."""
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if request.method != "GET":  # a form sent after the session ended: back to the page it was on
        referer = urlsplit(request.headers.get("referer", ""))
        same = referer.netloc == request.headers.get("host") and referer.path.startswith("/console/")
        target = referer.path + (f"?{referer.query}" if referer.query else "") if same else "/console/overview"
    response = back("/console/sign-in", problem=why)
    response.headers["location"] = f"/console/sign-in?next={quote(target)}"
    return response
