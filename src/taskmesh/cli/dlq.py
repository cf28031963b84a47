"""``taskmesh dlq list|replay|discard``: a queue's dead-lettered tasks, through the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from taskmesh.cli import bulk, common
from taskmesh.cli.api import Api, ApiError, queue_path, task_path
from taskmesh.cli.apps import App
from taskmesh.cli.exit_codes import EPILOG, ExitCode
from taskmesh.cli.output import note, one_line, print_json, print_table, say, when

app = App(
    help="See a queue's dead-lettered tasks and replay or discard them, one, some or all.",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

QueueName = Annotated[str, typer.Argument(help="The queue's name.", metavar="QUEUE")]
Ids = Annotated[list[str] | None, typer.Argument(help="Task ids (UUIDs) of dead-lettered tasks.", metavar="ID")]
YesAll = Annotated[
    bool, typer.Option("--yes", "-y", help="With --all: do not ask before acting (needed without a terminal).")
]
All = Annotated[
    bool, typer.Option("--all", help="Every dead-lettered task of the queue, as a bulk operation with progress.")
]


@app.command("list")
def list_dlq(
    queue: QueueName,
    count: Annotated[
        int, typer.Option("--count", "-c", min=1, max=1000, help="How many, oldest first (1 to 1000).", metavar="N")
    ] = 50,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """List a queue's dead-lettered tasks, oldest first, with their last attempt and error.

    Examples:

    ```
    taskmesh dlq list emails
    taskmesh dlq list emails --count 500 --json | jq -r '.tasks[].id'
    ```
    """
    with Api(url, api_key) as api:
        answer = api.get(queue_path(queue, "/dlq"), [("count", str(count))]).body
    if json:
        print_json(answer)
        return
    rows = []
    for t in answer["tasks"]:
        run = t.get("latest_run") or {}
        rows.append((t["id"], t["name"], run.get("attempt"), when(run.get("finished_at")), one_line(run.get("error"))))
    print_table(("ID", "NAME", "ATTEMPT", "FAILED (UTC)", "ERROR"), rows)
    if not rows:
        note(f"the dead-letter queue of {queue} is empty")


@app.command("replay")
def replay(
    queue: QueueName,
    task_ids: Ids = None,
    count: Annotated[
        int | None, typer.Option("--count", "-c", min=1, max=1000, help="Replay the oldest N (default 1).", metavar="N")
    ] = None,
    all_: All = False,
    priority: Annotated[
        int | None,
        typer.Option("--priority", min=0, max=1000, help="Replay at this priority (0 to 1000).", metavar="PRIORITY"),
    ] = None,
    yes: YesAll = False,
    reason: bulk.Reason = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """Move dead-lettered tasks back to ready with a fresh retry budget: the given ids, the oldest
    N (--count), or --all.

    Ids that are not dead-lettered in QUEUE are named and the command exits 1.

    Examples:

    ```
    taskmesh dlq replay emails 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f
    taskmesh dlq replay emails --count 100 --priority 900
    taskmesh dlq replay emails --all --reason "SMTP fixed" --yes
    ```
    """
    if sum((bool(task_ids), count is not None, all_)) > 1:
        raise typer.BadParameter("give ids, --count or --all, not several", param_hint="'ID'")
    with Api(url, api_key) as api:
        if all_:
            if priority is not None:
                raise typer.BadParameter("--all replays at each task's own priority", param_hint="'--priority'")
            bulk.run_action(
                api, "replay", {"status": ["failed"], "queue": queue},
                dry_run=False, reason=reason, yes=yes, no_wait=False, json=json,
            )  # fmt: skip
            return
        body: dict[str, Any] = {"ids": task_ids} if task_ids else {"count": count or 1}
        if priority is not None:
            body["override_priority"] = priority
        answer = api.post(queue_path(queue, "/dlq/replay"), body).body
    missing = answer.get("not_replayed") or []
    if json:
        print_json(answer)
    else:
        say(f"replayed {answer['count']} from {queue}")
        for task_id in answer["replayed"]:
            say(f"  {task_id}")
        for task_id in missing:
            note(f"taskmesh: error: {task_id}: not dead-lettered in {queue}")
    if missing:
        raise typer.Exit(int(ExitCode.FAILED))


@app.command("discard")
def discard(
    queue: QueueName,
    task_ids: Ids = None,
    all_: All = False,
    yes: YesAll = False,
    reason: bulk.Reason = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """Delete dead-lettered tasks of QUEUE and their runs: the given ids, or --all; saying why.

    Discarding cannot be undone, so it needs --reason, kept in the audit log (exit 2 without one).
    An id that is not dead-lettered in QUEUE is left alone, named, and the command exits 1 (3
    when no such task exists).

    Examples:

    ```
    taskmesh dlq discard emails 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f --reason "duplicate of INC-4211"
    taskmesh dlq discard emails --all --reason "obsolete campaign" --yes
    ```
    """
    if bool(task_ids) == all_:
        raise typer.BadParameter("give the ids to discard, or --all", param_hint="'ID'")
    why = "" if all_ else bulk.required_reason(reason, "discarding")  # --all asks after counting
    with Api(url, api_key) as api:
        if all_:
            bulk.run_action(
                api, "delete", {"status": ["failed"], "queue": queue},
                dry_run=False, reason=reason, yes=yes, no_wait=False, json=json,
            )  # fmt: skip
            return
        worst = ExitCode.OK
        for task_id in task_ids or []:
            try:
                task = api.get(task_path(task_id)).body["task"]
                if task["status"] != "failed" or task["queue_name"] != queue:
                    _refuse(
                        task_id, f"not dead-lettered in {queue} (it is {task['status']} in {task['queue_name']})", json
                    )
                    worst = worst or ExitCode.FAILED
                    continue
                api.delete(task_path(task_id), [("reason", why)])
            except ApiError as exc:
                if exc.status is None:
                    raise
                _refuse(task_id, str(exc), json, exc.status)
                worst = worst or exc.exit_code
                continue
            if json:
                print_json({"task_id": task_id, "discarded": True})
            else:
                say(f"{task_id}: discarded")
    if worst:
        raise typer.Exit(int(worst))


def _refuse(task_id: str, why: str, json: bool, status: int | None = None) -> None:
    if json:
        print_json({"task_id": task_id, "error": why, "status": status})
    else:
        note(f"taskmesh: error: {task_id}: {why}")
