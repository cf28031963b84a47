"""``taskmesh schedules list|trigger|pause|resume``: the operator's verbs on cron schedules.

Talks to PostgreSQL and Redis directly (``DATABASE_URL``, ``REDIS_URL``, as the
instances have them), so it works whether or not an instance serves the API; the
same operations as ``/api/v1/schedules``. A sleeping scheduler learns of a pause or
resume through PostgreSQL ``NOTIFY`` at once.
"""

from __future__ import annotations

import getpass
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
import typer

from taskmesh.cli import common
from taskmesh.cli.exit_codes import EPILOG, ExitCode
from taskmesh.cli.output import note, print_json, print_table, say
from taskmesh.errors import ConfigError, ScheduleNotFoundError

if TYPE_CHECKING:
    from taskmesh.schedules import Schedules

app = typer.Typer(
    help="List, trigger, pause or resume cron schedules (talks to the stores: DATABASE_URL and REDIS_URL).",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    invoke_without_command=True,
)

ScheduleName = Annotated[str, typer.Argument(help="The schedule's name.", metavar="NAME")]
T = TypeVar("T")


def _with_schedules(action: Callable[[Schedules], Awaitable[T]], audit_as: tuple[str, str] | None = None) -> T:
    """Open the stores, run ``action`` on the schedules, close them.

    :param audit_as: ``(action, schedule name)`` to record in the audit log as the ``cli`` actor with
        the OS user (in the change's own transaction where it has one).

    :raises ConfigError: ``DATABASE_URL`` or ``REDIS_URL`` missing (exit 2).
    :raises StoreError: a store refused (a password, a role, a missing database) or is down (exit 1).
    :raises typer.Exit: 3 when the schedule does not exist.
    """
    from taskmesh import audit
    from taskmesh.config import load_settings
    from taskmesh.logs import configure
    from taskmesh.schedules import Schedules
    from taskmesh.store import Stores
    from taskmesh.tasks import Tasks

    settings = load_settings()
    configure("warning", settings.log_format)
    if not settings.database_url or not settings.redis_url:
        raise ConfigError(
            "schedules needs DATABASE_URL and REDIS_URL (the deployment's stores, as the instances have them); "
            "the dev profile prints its own as dev_stores when it starts"
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
        list_schedules(json=False)


@app.command("list")
def list_schedules(json: common.StoresJson = False) -> None:
    """List the schedules: cron, zone, state, the last fire and the next one in the schedule's local time.

    Examples:

    ```
    taskmesh schedules list
    taskmesh schedules list --json | jq '.schedules[] | select(.paused)'
    ```
    """

    async def go(s: Schedules) -> list[dict[str, Any]]:
        return await s.list()

    items = _with_schedules(go)
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
        typer.Option("--idempotency-key", help="The task's idempotency key, so a repeat makes no second task."),
    ] = None,
    json: common.StoresJson = False,
) -> None:
    """Enqueue the schedule's task now, outside its cron times (the next fire is unchanged).

    Examples:

    ```
    taskmesh schedules trigger nightly-report
    taskmesh schedules trigger nightly-report --idempotency-key rerun-2026-12-01
    ```
    """

    async def go(s: Schedules) -> tuple[Any, str, bool]:
        return await s.trigger(name, idempotency_key)

    task_id, key, created = _with_schedules(go, ("schedule.trigger", name))
    answer = {"schedule": name, "task_id": str(task_id), "idempotency_key": key, "created": created}
    if json:
        print_json(answer)
    else:
        say(f"{'created' if created else 'exists'} task {task_id} ({key})")


def _set_paused(name: str, paused: bool, json: bool) -> None:
    async def go(s: Schedules) -> dict[str, Any]:
        return await s.set_paused(name, paused)

    item = _with_schedules(go, ("schedule.pause" if paused else "schedule.resume", name))
    if json:
        print_json(item)
    else:
        say(f"{name}: {'paused' if item['paused'] else 'active'}")


@app.command("pause")
def pause(name: ScheduleName, json: common.StoresJson = False) -> None:
    """Pause a schedule until resumed (or until its config changes); fires while paused are not made.

    Examples:

    ```
    taskmesh schedules pause nightly-report
    ```
    """
    _set_paused(name, True, json)


@app.command("resume")
def resume(name: ScheduleName, json: common.StoresJson = False) -> None:
    """Resume a paused schedule from its next fire; fires missed while paused are not made.

    Examples:

    ```
    taskmesh schedules resume nightly-report
    ```
    """
    _set_paused(name, False, json)
