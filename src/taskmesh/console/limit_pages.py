"""The console's task limits: the Limits page, its two forms, and a waiting task's reasons in words.

The page reads ``GET /api/v1/limits`` as its visitor (a tenant-bound key sees the limits counted per
tenant, and of each only its own counter) and follows it every few seconds. A key that may change a
limit (``queues:admin``, not bound to a tenant, reaching the limit's queue) gets a form per limit: its
numbers set at run time (``PUT /api/v1/limits/{limit}``, the limit's ``queue``, ``task`` and ``key``
kept as they are) and, for a number set at run time, a typed ``drop`` that removes it
(``DELETE /api/v1/limits/{limit}``). The task page says why a task waits from its ``blocked_by``
(:func:`waiting`), reading the limit it waits for to count the runs holding it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from starlette.responses import Response

from taskmesh.console import sessions
from taskmesh.console.api_client import ConsoleApi, refusal
from taskmesh.console.redirects import back
from taskmesh.console.web import Visitor, failed, render, visitor
from taskmesh.limits.settings import LIMIT_NAME

router = APIRouter(include_in_schema=False)

PAGE = "/console/limits"
Small = Annotated[str, Form(max_length=100)]
_WHOLE = re.compile(r"[0-9]{1,9}")


@router.get(PAGE)
async def limits_page(request: Request) -> Response:
    """Every limit in force with its numbers, where it comes from, and what it holds now per queue and key."""
    who = await visitor(request)
    async with ConsoleApi(request, who) as api:
        limits = await api.get("/api/v1/limits")
    shown = [_shown(who, limit) for limit in limits.body.get("limits", [])] if limits.ok else []
    usage = [u for limit in shown for u in limit["usage"]]
    return render(
        request,
        who,
        "limits.html",
        api_refusal=refusal([limits]),
        limits=limits,
        shown=shown,
        usage=usage,
        editable=[limit for limit in shown if limit["editable"]],
    )


def _shown(who: Visitor, limit: dict[str, Any]) -> dict[str, Any]:
    """A limit of the API's answer with what the page says of it: whom it holds, its usage rows, whether
    the visitor may change it."""
    usage = []
    for u in limit.get("usage", []):
        _, colon, value = u["key"].partition(":")
        cap = limit.get("concurrency")
        usage.append(
            {
                **u,
                "limit": limit["name"],
                "value": value if colon else None,
                "full": cap is not None and u["in_use"] >= cap,
                "cap": cap,
                "until": _iso_ms(u.get("backing_off_until_ms")),
            }
        )
    return {**limit, "applies_to": applies_to(limit), "usage": usage, "editable": may_change(who, limit)}


def applies_to(limit: dict[str, Any]) -> str:
    """Whom a limit holds, in words: ``"task mail.send, any queue, one counter per payload.customer"``."""
    if limit.get("queue") is None and limit.get("task") is None and limit.get("key") is None:
        return "only tasks that name it (concurrency_key), one counter per value they give"
    parts = [
        f"task {limit['task']}" if limit.get("task") else "any task",
        f"queue {limit['queue']}" if limit.get("queue") else "any queue",
    ]
    key = limit.get("key")
    parts.append("one counter per tenant" if key == "tenant_id" else f"one counter per {key}" if key else "one counter")
    return ", ".join(parts)


def may_change(who: Visitor, limit: dict[str, Any]) -> bool:
    """Whether the visitor's key may set or drop ``limit``: ``queues:admin``, no tenant (a limit's numbers
    hold for every tenant), and, for a key bound to queues, a limit of one of them (as the API decides)."""
    principal = who.principal
    if not who.can("queues:admin") or principal.tenant_id is not None:
        return False
    return principal.queues is None or (limit.get("queue") is not None and limit["queue"] in principal.queues)


def _iso_ms(ms: int | None) -> str | None:
    """Milliseconds since the Unix epoch as ISO 8601 in UTC (``None`` stays ``None``)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


async def _acting(request: Request, csrf_token: str) -> Visitor:
    """The visitor, once the form is the console's own (CSRF token, ``Origin``, ``Sec-Fetch-Site``)."""
    who = await visitor(request)
    sessions.check_change(request, who.session, csrf_token)
    return who


@router.post(PAGE + "/{name}/set")
async def set_limit(
    request: Request, name: str, csrf_token: Small = "", concurrency: Small = "", rate: Small = "", burst: Small = ""
) -> Response:
    """``PUT /api/v1/limits/{name}`` with the form's numbers and the limit's own ``queue``, ``task`` and ``key``
    (read first: the form changes numbers, never whom the limit holds). An empty concurrency or rate is
    none; an empty burst is the default (1)."""
    who = await _acting(request, csrf_token)
    if not LIMIT_NAME.fullmatch(name):
        return back(PAGE, problem=f"{name[:80]!r} is not a limit name")
    numbers: dict[str, Any] = {}
    for field, text in (("concurrency", concurrency.strip()), ("burst", burst.strip())):
        if not text:
            continue
        if not _WHOLE.fullmatch(text):
            return back(PAGE, problem=f"Limit {name} not set: {field} must be a whole number, not {text[:20]!r}.")
        numbers[field] = int(text)
    if rate.strip():
        numbers["rate"] = rate.strip()
    async with ConsoleApi(request, who) as api:
        now = await api.get(f"/api/v1/limits/{name}")
        if not now.ok:
            return failed(request, who, PAGE, f"Limit {name} not set", now)
        selects = {k: now.body[k] for k in ("queue", "task", "key") if now.body.get(k) is not None}
        done = await api.put(f"/api/v1/limits/{name}", {**selects, **numbers})
    if not done.ok:
        return failed(request, who, PAGE, f"Limit {name} not set", done)
    return back(
        PAGE,
        notice=f"Limit {name} set at run time: {numbers_in_words(done.body)}. Every instance holds it within a second.",
    )


@router.post(PAGE + "/{name}/drop")
async def drop_limit(request: Request, name: str, csrf_token: Small = "", confirm: Small = "") -> Response:
    """``DELETE /api/v1/limits/{name}``, once the person typed ``drop``: the configured limit of that name, if
    any, holds again."""
    who = await _acting(request, csrf_token)
    if not LIMIT_NAME.fullmatch(name):
        return back(PAGE, problem=f"{name[:80]!r} is not a limit name")
    if confirm.strip().lower() != "drop":
        return back(PAGE, problem=f"Limit {name} not dropped: type drop in the box to confirm.")
    async with ConsoleApi(request, who) as api:
        done = await api.delete(f"/api/v1/limits/{name}")
        after = await api.get(f"/api/v1/limits/{name}") if done.ok else None
    if not done.ok:
        return failed(request, who, PAGE, f"Limit {name} not dropped", done)
    if after is not None and after.ok:
        return back(PAGE, notice=f"Limit {name}: the configured one holds again ({numbers_in_words(after.body)}).")
    if after is not None and after.status == 404:
        return back(PAGE, notice=f"Limit {name} dropped: none of that name is configured, so it holds no task now.")
    return back(PAGE, notice=f"Limit {name}: its run-time setting dropped.")


def numbers_in_words(limit: dict[str, Any]) -> str:
    """A limit's numbers: ``"concurrency 5, rate 30/m, burst 3"`` (the burst only with a rate)."""
    parts = []
    if limit.get("concurrency") is not None:
        parts.append(f"concurrency {limit['concurrency']}")
    if limit.get("rate") is not None:
        parts += [f"rate {limit['rate']}", f"burst {limit.get('burst', 1)}"]
    return ", ".join(parts)


async def waiting(api: ConsoleApi, task: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Why ``task`` (of ``GET /api/v1/tasks/{id}``) is not running, one sentence per reason of its
    ``blocked_by``: ``[{"text", "until"?, "tail"?, "href"?, "link"?}]`` (``until`` an ISO time shown after
    ``text``, then ``tail``; ``href`` a page that says more). ``None``: it is not waiting (running, or over).

    A limit's reason counts the runs holding its key from ``GET /api/v1/limits/{limit}`` (left out when
    the visitor's key may not read that limit).
    """
    reasons = task.get("blocked_by")
    if reasons is None:
        return None
    if not reasons:
        return [{"text": "Ready: waiting for a free worker"}]
    said: list[dict[str, Any]] = []
    for reason in reasons:
        kind = reason.get("reason")
        if kind == "workflow":
            href = f"/console/workflows/{reason.get('workflow_id')}"
            said.append({"text": "Waiting for its workflow's deps", "href": href, "link": "workflow page"})
        elif kind == "delay":
            tail = " (the backoff before its retry)" if task.get("retries") else ""
            said.append({"text": "Delayed until", "until": reason.get("until"), "tail": tail})
        elif kind == "queue_paused":
            said.append({"text": "Queue paused", "tail": ": no instance claims its tasks until it is resumed"})
        elif kind == "fair_share":
            key = reason.get("key") or "(none)"
            text = f"Waiting its turn: fair shares, key {key}"
            said.append({"text": text, "tail": " (keys with fewer running go first)"})
        elif kind == "limit":
            said.append(await _limit_words(api, task, reason))
        else:  # a reason of a newer API: said as it is
            said.append({"text": f"Waiting: {kind}"})
    return said


async def _limit_words(api: ConsoleApi, task: dict[str, Any], reason: dict[str, Any]) -> dict[str, Any]:
    """``Waiting for limit api (2/2 running)`` and its kin (see :func:`waiting`)."""
    name = str(reason.get("limit"))
    key = str(reason.get("key", name))
    _, colon, value = key.partition(":")
    text = f"Waiting for limit {name}" + (f", key {value}" if colon else "")
    said: dict[str, Any] = {"href": PAGE, "link": "Limits page"}
    holds = reason.get("holds")
    if holds == "back_off":
        until = _iso_ms(reason.get("until_ms"))
        return {**said, "text": f"{text}: backing off until", "until": until, "tail": " (a handler asked it to wait)"}
    limit = await api.get(f"/api/v1/limits/{name}")
    if not limit.ok:  # a tenant-bound key reads only the limits counted per tenant
        return {**said, "text": f"{text} (at its {'rate' if holds == 'rate' else 'concurrency'})"}
    if holds == "rate":
        return {**said, "text": f"{text} (rate {limit.body.get('rate')}, burst {limit.body.get('burst', 1)})"}
    in_use = next(
        (u["in_use"] for u in limit.body.get("usage", []) if u["key"] == key and u["queue"] == task.get("queue_name")),
        None,
    )
    cap = limit.body.get("concurrency")
    counted = f"{in_use}/{cap} running" if in_use is not None and cap is not None else "at its concurrency"
    return {**said, "text": f"{text} ({counted})"}
