"""``taskmesh limits list|show|set|unset``: the task limits in force and what each holds, through the HTTP API.

A limit holds the tasks its queue and task name select to ``concurrency`` runs at once and ``rate``
starts per second, minute or hour, across every instance; with a ``key`` (``tenant_id`` or
``payload.<path>``), separately per value. ``set`` overrides the configured limit of its name (or adds
one) on every instance within a second, and ``unset`` drops what ``set`` set, so that the configured
one, if any, holds again. Reading takes ``tasks:read``; setting and unsetting take ``queues:admin`` and
are audited (``limit.set``, ``limit.unset``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from taskmesh.cli import common
from taskmesh.cli.api import Api, limit_path
from taskmesh.cli.apps import App
from taskmesh.cli.exit_codes import EPILOG
from taskmesh.cli.output import note, print_fields, print_json, print_table, say, when

app = App(
    help="See the task limits in force (configured or set at run time) and what each holds now; set or unset "
    "one at run time.",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

LimitName = Annotated[
    str, typer.Argument(help="The limit's name: lower-case letters, digits, - and _ (up to 64).", metavar="NAME")
]
SETTINGS = ("concurrency", "rate", "burst", "queue", "task", "key")
"""A limit's fields as ``set`` takes them and its answer shows them, in that order."""


NAMED_ONLY = "only tasks naming it"
"""What a limit with no queue, task or key selects: the tasks whose ``concurrency_key`` names it."""


def _any(value: Any, limit: dict[str, Any] | None = None) -> Any:
    """A selector left unset selects every queue or task; a limit with none set selects only tasks naming it."""
    if limit is not None and limit["queue"] is None and limit["task"] is None and limit["key"] is None:
        return NAMED_ONLY
    return "any" if value is None else value


def _burst(limit: dict[str, Any]) -> Any:
    """The burst means something only with a rate."""
    return limit["burst"] if limit["rate"] is not None else None


def _until(ms: int | None) -> str | None:
    """A back-off's end (ms since the epoch) as ``YYYY-MM-DD HH:MM:SS`` UTC."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


@app.command("list")
def list_limits(url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False) -> None:
    """List the limits in force: what each selects, its numbers, where it comes from and what it holds now.

    SOURCE is config (the configuration's) or api (set at run time). IN USE counts the runs holding its
    slots and WAITING the tasks parked until it has room, over its counters shown (a limit with a key:
    the keys with tasks waiting). A key bound to a tenant sees only the limits counted per tenant.

    Examples:

    ```
    taskmesh limits list
    taskmesh limits list --json | jq '.limits[] | select(.source == "api")'
    ```
    """
    with Api(url, api_key) as api:
        answer = api.get("/api/v1/limits").body
    if json:
        print_json(answer)
        return
    rows = [
        (
            x["name"],
            x["source"],
            _any(x["queue"], x),
            _any(x["task"], x),
            x["key"],
            x["concurrency"],
            x["rate"],
            _burst(x),
            sum(u["in_use"] for u in x["usage"]),
            sum(u["waiting"] for u in x["usage"]),
        )
        for x in answer["limits"]
    ]
    print_table(("NAME", "SOURCE", "QUEUE", "TASK", "KEY", "CONCURRENCY", "RATE", "BURST", "IN USE", "WAITING"), rows)
    if not rows:
        note("no limit is configured or set")


@app.command("show")
def show(name: LimitName, url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False) -> None:
    """Show one limit: what it selects, its numbers, who set it, and per queue and key what it holds now.

    Examples:

    ```
    taskmesh limits show per-customer
    ```
    """
    with Api(url, api_key) as api:
        x = api.get(limit_path(name)).body
    if json:
        print_json(x)
        return
    set_at = f"{when(x['updated_at'])} UTC" + (f" by key {x['updated_by']}" if x["updated_by"] else "")
    print_fields(
        [
            ("limit", x["name"]),
            ("source", x["source"]),
            ("queue", _any(x["queue"], x)),
            ("task", _any(x["task"], x)),
            ("key", x["key"]),
            ("concurrency", x["concurrency"]),
            ("rate", x["rate"]),
            ("burst", _burst(x)),
            ("set", set_at if x["updated_at"] else None),
        ]
    )
    say("")
    print_table(
        ("QUEUE", "KEY", "IN USE", "WAITING", "BACKING OFF UNTIL (UTC)"),
        [(u["queue"], u["key"], u["in_use"], u["waiting"], _until(u["backing_off_until_ms"])) for u in x["usage"]],
        title="holds now",
    )


@app.command("set")
def set_limit(
    name: LimitName,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", help="Most runs at once.", metavar="N")
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", "-r", help="Most starts per second, minute or hour: 20/s, 600/m, 5/h.", metavar="RATE"),
    ] = None,
    burst: Annotated[
        int | None,
        typer.Option(
            "--burst", "-b", help="Starts allowed at once after a quiet spell, with --rate (default 1).", metavar="N"
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue",
            "-q",
            help="Only tasks of this queue (default: any; with no --queue, --task or --key, only tasks naming the "
            "limit in their concurrency_key).",
            metavar="QUEUE",
        ),
    ] = None,
    task: Annotated[
        str | None, typer.Option("--task", "-t", help="Only tasks of this task name (default: any).", metavar="TASK")
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            "-k",
            help="Count per value of tenant_id or payload.PATH (payload.customer.id), each on its own.",
            metavar="KEY",
        ),
    ] = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """Set a limit at run time, on every instance within a second: --concurrency, --rate, or both.

    It replaces the limit of that name as a whole (the configured one, or one set before): flags left
    out are unset. Its numbers hold at once for queued tasks that hold its keys; a limit that selects
    other tasks holds those created from now on (a task's limits are decided when it is created).

    Examples:

    ```
    taskmesh limits set per-customer --task reports.build --key payload.customer.id --concurrency 2
    taskmesh limits set provider --queue emails --rate 20/s --burst 5
    ```
    """
    given = {"concurrency": concurrency, "rate": rate, "burst": burst, "queue": queue, "task": task, "key": key}
    with Api(url, api_key) as api:
        x = api.put(limit_path(name), {k: v for k, v in given.items() if v is not None}).body
    if json:
        print_json(x)
        return
    shown = {**x, "burst": _burst(x)}
    say(f"{name}: set (" + ", ".join(f"{k} {shown[k]}" for k in SETTINGS if shown[k] is not None) + ")")
    if _any(None, x) == NAMED_ONLY:
        say(f"{name} selects no queue, task or key: it holds only tasks created with concurrency_key {name}[:VALUE]")


@app.command("unset")
def unset(name: LimitName, url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False) -> None:
    """Drop the limit set at run time under NAME; the configured one of that name, if any, holds again.

    Every instance holds the change within a second. A name never set at run time is not found (exit 3).

    Examples:

    ```
    taskmesh limits unset per-customer
    ```
    """
    with Api(url, api_key) as api:
        api.delete(limit_path(name))
    if json:
        print_json({"limit": name, "unset": True})
    else:
        say(f"{name}: unset")
