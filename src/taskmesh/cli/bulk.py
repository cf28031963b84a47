"""``taskmesh bulk retry|replay|cancel|delete|show``: act on every task a filter matches.

Each action counts its matches first (a dry run of the API), asks before acting
when a person is at the terminal (``--yes`` skips the question, and is needed
when none is), then starts the operation and follows it with a progress bar
until it ends. The bar's total is the dry run's count: tasks that change state
in between are counted as skipped, not acted on twice.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taskmesh.cli import common
from taskmesh.cli.api import Api, operation_path
from taskmesh.cli.apps import App
from taskmesh.cli.exit_codes import EPILOG, ExitCode
from taskmesh.cli.output import note, print_json, say, stderr_console

app = App(
    help="Retry, replay, cancel or delete every task a filter matches, with a dry run and a progress bar.",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

POLL_SECONDS = 0.5
"""How often a running operation's progress is read."""

ACTIONS = {
    "retry": ("retried", "Queue failed and cancelled tasks again with a fresh retry budget."),
    "replay": ("replayed", "Move dead-lettered (failed) tasks back to ready with a fresh retry budget."),
    "cancel": ("cancelled", "Cancel queued and running tasks."),
    "delete": ("deleted", "Delete finished tasks (completed, failed, cancelled) and their runs."),
}

DryRun = Annotated[bool, typer.Option("--dry-run", help="Only count the matches and show a sample; change nothing.")]
Reason = Annotated[
    str | None,
    typer.Option(
        "--reason",
        "-r",
        help="Why (needed to act; kept with the operation and in the audit log; up to 500 characters).",
        metavar="TEXT",
    ),
]


def required_reason(reason: str | None, acting: str) -> str:
    """The ``--reason`` a destructive command needs, before anything is sent.

    :param acting: the action, for the message (``deleting``).
    :raises typer.BadParameter: missing or blank (exit 2, naming ``--reason``).
    """
    if reason is None or not reason.strip():
        raise typer.BadParameter(f"{acting} cannot be undone: say why, kept in the audit log", param_hint="'--reason'")
    return reason


Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before acting (needed without a terminal).")]
NoWait = Annotated[
    bool, typer.Option("--no-wait", help="Start the operation and print its id; do not follow its progress.")
]


def run_action(
    api: Api,
    action: str,
    filter_: dict[str, Any],
    *,
    dry_run: bool,
    reason: str | None,
    yes: bool,
    no_wait: bool,
    json: bool,
) -> None:
    """Count, confirm, start and follow one bulk action; see the module's docstring.

    :raises typer.Exit: 0 when nothing matches or the person says no; 2 without ``--reason``, or
        without ``--yes`` and no terminal; 1 when the operation ends ``failed``.
    :raises ApiError: the API refused the filter (exit 2 with the field named) or could not be reached.
    """
    body: dict[str, Any] = {"filter": filter_, "action": action, "dry_run": True}
    count = api.post("/api/v1/tasks:bulk", body).body
    if dry_run:
        if json:
            print_json(count)
        else:
            more = "" if count["complete"] else " or more"
            say(f"would {action} {_tasks(count['matched'])}{more}" + (", for example:" if count["sample"] else ""))
            for task_id in count["sample"]:
                say(f"  {task_id}")
        return
    if count["matched"] == 0:
        if json:
            print_json(count)
        else:
            say(f"no task matches: nothing to {action}")
        return
    if not (reason or "").strip():
        note(
            f"taskmesh: error: {action} would act on {_tasks(count['matched'])}; give --reason: why, kept with the "
            "operation and in the audit log"
        )
        raise typer.Exit(int(ExitCode.USAGE))
    if not yes:
        _confirm(action, count)
    if reason:
        body["reason"] = reason
    body["dry_run"] = False
    operation = api.post("/api/v1/tasks:bulk", body).body
    if no_wait:
        if json:
            print_json(operation)
        else:
            op_id = operation["operation_id"]
            say(f"operation {op_id} started; follow it: taskmesh bulk show {op_id} --follow")
        return
    final = follow(api, operation["operation_id"], count["matched"] if count["complete"] else None, show=not json)
    finish(final, json)


def _confirm(action: str, count: dict[str, Any]) -> None:
    if not sys.stdin.isatty():
        note(
            f"taskmesh: error: {action} would act on {_tasks(count['matched'])}; give --yes to do it without a terminal"
        )
        raise typer.Exit(int(ExitCode.USAGE))
    more = "" if count["complete"] else " or more"
    if not typer.confirm(f"{action} {_tasks(count['matched'])}{more}?", err=True):
        note("nothing done")
        raise typer.Exit(int(ExitCode.OK))


def _tasks(n: int) -> str:
    return f"{n:,} task" if n == 1 else f"{n:,} tasks"


def follow(api: Api, operation_id: str, total: int | None, *, show: bool) -> dict[str, Any]:
    """Poll an operation until it is no longer running; with ``show``, draw a progress bar on stderr.

    :param total: the expected number of tasks (the dry run's count), ``None`` when unknown.
    :returns: the operation's final answer of ``GET /api/v1/operations/{id}``.
    """
    path = operation_path(operation_id)
    if not show:
        return _poll(api, path, lambda op: None)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("skipped {task.fields[skipped]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=stderr_console(), transient=False) as progress:
        bar = progress.add_task(f"operation {operation_id[:8]}", total=total, skipped=0)

        def draw(op: dict[str, Any]) -> None:
            moved = op["done"] + op["skipped"]
            progress.update(
                bar, completed=moved, total=max(total or 0, moved) if total is not None else None, skipped=op["skipped"]
            )

        return _poll(api, path, draw)


def _poll(api: Api, path: str, draw: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    while True:
        op: dict[str, Any] = api.get(path).body
        draw(op)
        if op["status"] != "running":
            return op
        time.sleep(POLL_SECONDS)


def finish(op: dict[str, Any], json: bool) -> None:
    """Print an ended (or running) operation's outcome; exit 1 when it failed."""
    if json:
        print_json(op)
    else:
        past = ACTIONS[op["action"]][0]
        if op["status"] == "running":
            state = "running"
        elif op["status"] == "done":
            state = "done"
        else:
            state = f"failed: {op['error']}"
        say(
            f"operation {op['operation_id']} {state}: {past} {op['done']:,}, skipped {op['skipped']:,} "
            "(no longer in a state the action applies to)"
        )
    if op["status"] == "failed":
        raise typer.Exit(int(ExitCode.FAILED))


def _make(action: str) -> None:
    past, summary = ACTIONS[action]

    def command(
        status: common.Status = None,
        queue: common.Queue = None,
        name: common.Name = None,
        tenant_id: common.Tenant = None,
        dedup_key: common.DedupKey = None,
        error: common.ErrorText = None,
        created_after: common.CreatedAfter = None,
        created_before: common.CreatedBefore = None,
        finished_after: common.FinishedAfter = None,
        finished_before: common.FinishedBefore = None,
        payload: common.Payload = None,
        dry_run: DryRun = False,
        reason: Reason = None,
        yes: Yes = False,
        no_wait: NoWait = False,
        url: common.Url = None,
        api_key: common.ApiKey = None,
        json: common.Json = False,
    ) -> None:
        flt = common.SearchFilter(
            status,
            queue,
            name,
            tenant_id,
            dedup_key,
            error,
            created_after,
            created_before,
            finished_after,
            finished_before,
            payload,
        )
        with Api(url, api_key) as api:
            run_action(api, action, flt.body(), dry_run=dry_run, reason=reason, yes=yes, no_wait=no_wait, json=json)

    example_filter = {
        "retry": "--status cancelled --queue reports",
        "replay": '--status failed --queue emails --error "SMTP 421"',
        "cancel": "--status queued --name nightly-export",
        "delete": "--status completed --finished-before 2026-11-01T00:00:00Z",
    }[action]
    command.__doc__ = f"""{summary}

    Takes the filters of `taskmesh tasks list` (at least one). Counts the matches first, asks
    before acting, then follows the operation with a progress bar; tasks that changed state
    meanwhile are skipped, never acted on twice. Ends with the {past} and skipped counts.

    Examples:

    ```
    taskmesh bulk {action} {example_filter} --dry-run
    taskmesh bulk {action} {example_filter} --reason "INC-4211" --yes   # acting needs a reason
    ```
    """
    app.command(action)(command)


for _action in ACTIONS:
    _make(_action)


@app.command("show")
def show(
    operation_id: Annotated[str, typer.Argument(help="The operation's id (a UUID).", metavar="OPERATION_ID")],
    follow_it: Annotated[
        bool, typer.Option("--follow", "-f", help="Follow it with a progress bar until it ends.")
    ] = False,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """Show a bulk operation's progress: done, skipped, and how it ended.

    Examples:

    ```
    taskmesh bulk show 6a1f0c9e-8b2d-4e3f-a1b2-c3d4e5f6a7b8 --follow
    ```
    """
    with Api(url, api_key) as api:
        op = api.get(operation_path(operation_id)).body
        if follow_it and op["status"] == "running":
            op = follow(api, operation_id, None, show=not json)
    finish(op, json)
