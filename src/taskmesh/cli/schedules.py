"""``taskmesh schedules list|trigger|pause|resume``: the operator's verbs on cron schedules.

Given an instance's URL (``--url`` or ``TASKMESH_URL``, before or after the command),
they go through its ``/api/v1/schedules`` routes with the API key (its scopes, tenant
and queues apply, and the audit log names the key). Without one they talk to
PostgreSQL and Redis directly (``DATABASE_URL``, ``REDIS_URL``, as the instances have
them), so they work whether or not an instance serves the API, and the audit log
names the OS user. Both ways print the same answers. A sleeping scheduler learns of a
pause or resume through PostgreSQL ``NOTIFY`` at once.
"""

from __future__ import annotations

import getpass
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
import typer

from taskmesh.cli import common
from taskmesh.cli.api import Api, given_url, segment
from taskmesh.cli.apps import App
from taskmesh.cli.exit_codes import EPILOG, ExitCode
from taskmesh.cli.output import note, print_json, print_table, say
from taskmesh.errors import ConfigError, ScheduleNotFoundError

if TYPE_CHECKING:
    from taskmesh.schedules.schedules import Schedules

app = App(
    help="List, trigger, pause or resume cron schedules: through an instance's API given --url or TASKMESH_URL, "
    "else through the stores (DATABASE_URL and REDIS_URL).",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    invoke_without_command=True,
)

ScheduleName = Annotated[str, typer.Argument(help="The schedule's name.", metavar="NAME")]
T = TypeVar("T")


def _act(
    url: str | None,
    api_key: str | None,
    through_api: Callable[[Api], T],
    through_stores: Callable[[Schedules], Awaitable[T]],
    audit_as: tuple[str, str] | None = None,
) -> T:
    """``through_api`` when a URL is given (:func:`~taskmesh.cli.api.given_url`), else ``through_stores``
    (:func:`_with_schedules`, recording ``audit_as``).

    :raises ApiError: the API refused or could not be reached (its exit status: 3 for no such schedule).
    """
    if given_url(url) is not None:
        with Api(url, api_key) as api:
            return through_api(api)
    return _with_schedules(through_stores, audit_as)


def _path(name: str, action: str) -> str:
    return f"/api/v1/schedules/{segment(name)}/{action}"


def _with_schedules(action: Callable[[Schedules], Awaitable[T]], audit_as: tuple[str, str] | None = None) -> T:
    """Open the stores, run ``action`` on the schedules, close them.

    :param audit_as: ``(action, schedule name)`` to record in the audit log as the ``cli`` actor with
        the OS user (in the change's own transaction where it has one).

    :raises ConfigError: ``DATABASE_URL`` or ``REDIS_URL`` missing (exit 2), naming ``--url`` too.
    :raises StoreError: a store refused (a password, a role, a missing database) or is down (exit 1).
    :raises typer.Exit: 3 when the schedule does not exist.
    """
    from taskmesh.config import load_settings
    from taskmesh.observability.logs import configure
    from taskmesh.schedules.schedules import Schedules
    from taskmesh.security import audit
    from taskmesh.store import Stores
    from taskmesh.tasks.tasks import Tasks

    settings = load_settings()
    configure("warning", settings.log_format)
    if not settings.database_url or not settings.redis_url:
        raise ConfigError(
            "schedules needs an instance's API (--url or TASKMESH_URL) or the deployment's stores (DATABASE_URL "
            "and REDIS_URL, as the instances have them; the dev profile prints its own as dev_stores when it starts)"
        )
    database_url, redis_url = settings.database_url, settings.redis_url

    async def go() -> T:
        stores = await Stores.open(
            database_url,
            redis_url,
            redis_prefix=settings.redis_prefix,
            pool_size=2,
            pooler=settings.pg_pooler,
            redis_mode=settings.redis_mode,
        )
        try:
            # A trigger's push to a Redis that refuses would only be logged (the task is durable and the
            # reconciler pushes it later); a person at the terminal should hear of it at once instead.
            await stores.redis.ping()
            tasks = Tasks(stores.pg, stores.redis, default_max_retries=settings.default_max_retries)
            if audit_as is None:
                return await action(Schedules(tasks, []))
            event = audit.AuditEvent(
                audit_as[0],
                actor_type="cli",
                actor_id=getpass.getuser(),
                actor_name="taskmesh schedules",
                resource_type="schedule",
                resource_id=audit_as[1],
            )
            async with audit.recorded(stores.pg, event):
                return await action(Schedules(tasks, []))
        finally:
            await stores.close()

    try:
        return anyio.run(go)
    except ScheduleNotFoundError as exc:
        note(f"taskmesh: error: {exc}")
        raise typer.Exit(int(ExitCode.NOT_FOUND)) from None


@app.callback()
def schedules(ctx: typer.Context) -> None:
    """List, trigger, pause or resume cron schedules; without a verb, list them."""
    if ctx.invoked_subcommand is None:
        list_schedules()


@app.command("list")
def list_schedules(
    url: common.ApiOrStoresUrl = None, api_key: common.ApiKey = None, json: common.StoresJson = False
) -> None:
    """List the schedules: cron, zone, state, the last fire and the next one in the schedule's local time.

    Examples:

    ```
    taskmesh schedules list
    taskmesh schedules list --json | jq '.schedules[] | select(.paused)'
    taskmesh --url http://tm.internal:8080 schedules list
    ```
    """

    async def go(s: Schedules) -> list[dict[str, Any]]:
        return await s.list()

    items: list[dict[str, Any]] = _act(url, api_key, lambda api: api.get("/api/v1/schedules").body["schedules"], go)
    if json:
        print_json({"schedules": items})
        return
    rows = []
    for s in items:
        state = s["state"] if not s["error"] else f"error: {s['error']}"
        last = (s["last_fire"]["local"] or s["last_fire"]["utc"]) if s["last_fire"] else None
        nxt = s["next_fires"][0]["local"] if s["next_fires"] else None
        rows.append((s["name"], s["cron"], s["timezone"], state, last, nxt))
    print_table(("NAME", "CRON", "TIMEZONE", "STATE", "LAST FIRE (local)", "NEXT FIRE (local)"), rows)


@app.command("trigger")
def trigger(
    name: ScheduleName,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key", help="The task's idempotency key, so a repeat makes no second task.", metavar="KEY"
        ),
    ] = None,
    url: common.ApiOrStoresUrl = None,
    api_key: common.ApiKey = None,
    json: common.StoresJson = False,
) -> None:
    """Enqueue the schedule's task now, outside its cron times (the next fire is unchanged).

    Examples:

    ```
    taskmesh schedules trigger nightly-report
    taskmesh schedules trigger nightly-report --idempotency-key rerun-2026-12-01
    ```
    """

    async def go(s: Schedules) -> dict[str, Any]:
        task_id, key, created = await s.trigger(name, idempotency_key)
        return {"schedule": name, "task_id": str(task_id), "idempotency_key": key, "created": created}

    def api_trigger(api: Api) -> dict[str, Any]:
        body = {"idempotency_key": idempotency_key} if idempotency_key is not None else None
        answer: dict[str, Any] = api.post(_path(name, "trigger"), body).body
        return answer

    answer = _act(url, api_key, api_trigger, go, ("schedule.trigger", name))
    if json:
        print_json(answer)
    else:
        say(f"{'created' if answer['created'] else 'exists'} task {answer['task_id']} ({answer['idempotency_key']})")


def _set_paused(name: str, paused: bool, url: str | None, api_key: str | None, json: bool) -> None:
    async def go(s: Schedules) -> dict[str, Any]:
        return await s.set_paused(name, paused)

    def api_set(api: Api) -> dict[str, Any]:
        item: dict[str, Any] = api.post(_path(name, "pause" if paused else "resume")).body
        return item

    item = _act(url, api_key, api_set, go, ("schedule.pause" if paused else "schedule.resume", name))
    if json:
        print_json(item)
    else:
        say(f"{name}: {'paused' if item['paused'] else 'active'}")


@app.command("pause")
def pause(
    name: ScheduleName,
    url: common.ApiOrStoresUrl = None,
    api_key: common.ApiKey = None,
    json: common.StoresJson = False,
) -> None:
    """Pause a schedule until resumed (or until its config changes); fires while paused are not made.

    Examples:

    ```
    taskmesh schedules pause nightly-report
    ```
    """
    _set_paused(name, True, url, api_key, json)


@app.command("resume")
def resume(
    name: ScheduleName,
    url: common.ApiOrStoresUrl = None,
    api_key: common.ApiKey = None,
    json: common.StoresJson = False,
) -> None:
    """Resume a paused schedule from its next fire; fires missed while paused are not made.

    Examples:

    ```
    taskmesh schedules resume nightly-report
    ```
    """
    _set_paused(name, False, url, api_key, json)
