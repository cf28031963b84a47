"""``taskmesh tasks list|show|retry|cancel|delete``: find tasks and act on one or a few, through the HTTP API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import orjson
import typer

from taskmesh.cli import bulk, common
from taskmesh.cli.api import Api, ApiError, task_path
from taskmesh.cli.apps import App
from taskmesh.cli.exit_codes import EPILOG
from taskmesh.cli.output import (
    duration,
    note,
    one_line,
    print_fields,
    print_json,
    print_table,
    say,
    when,
)

app = App(
    help="Find tasks, show one with its runs, and retry, cancel or delete tasks.",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

TaskIds = Annotated[list[str], typer.Argument(help="Task ids (UUIDs); several are acted on one by one.", metavar="ID")]


@app.command("list")
def list_tasks(
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
    oldest_first: Annotated[bool, typer.Option("--oldest-first", help="Oldest first (default: newest first).")] = False,
    limit: Annotated[
        int, typer.Option("--limit", "-l", min=1, max=500, help="Tasks per page (1 to 500).", metavar="N")
    ] = 50,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Go on from a previous page (its next_cursor).", metavar="CURSOR")
    ] = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """List tasks newest first, one page at a time, with their latest run's status and error.

    Every filter is answered from an index or a bounded window of one; the next page's
    cursor is printed under the table (a page cut short by its window says so).

    Examples:

    ```
    taskmesh tasks list --status failed
    taskmesh tasks list -q emails -s queued -s running --limit 100
    taskmesh tasks list --payload customer.id=42 --created-after 2026-12-01T00:00:00Z
    taskmesh tasks list --error timeout --json | jq -r '.tasks[].id'
    ```
    """
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
    params = [*flt.query(), ("limit", str(limit)), ("order", "asc" if oldest_first else "desc")]
    if cursor:
        params.append(("cursor", cursor))
    with Api(url, api_key) as api:
        page = api.get("/api/v1/tasks", params).body
    if json:
        print_json(page)
        return
    rows = []
    for t in page["tasks"]:
        run = t.get("latest_run") or {}
        rows.append(
            (
                t["id"],
                t["name"],
                t["queue_name"],
                t["status"],
                t["attempts"],
                when(t["created_at"]),
                one_line(run.get("error")),
            )
        )
    print_table(("ID", "NAME", "QUEUE", "STATUS", "ATTEMPTS", "CREATED (UTC)", "ERROR"), rows)
    if page.get("partial"):
        note("this page was cut short: its filter reads a bounded window of the index per page; go on with the cursor")
    if page.get("next_cursor"):
        note(f"next page: --cursor {page['next_cursor']}")
    elif not rows:
        note("no task matches")


@app.command("show")
def show(
    task_id: Annotated[str, typer.Argument(help="The task's id (a UUID).", metavar="ID")],
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            "-w",
            min=0,
            max=60,
            help="Answer once the task has finished, or after this many seconds (0 to 60).",
            metavar="SECONDS",
        ),
    ] = 0,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """Show a task: its fields, payload, result and every run (attempt) with its error.

    --json prints the task's answer with a "runs" list added.

    Examples:

    ```
    taskmesh tasks show 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f
    taskmesh tasks show 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f --wait 30 --json
    ```
    """
    with Api(url, api_key) as api:
        params = [("wait", _seconds(wait))] if wait else None
        answer = api.get(task_path(task_id), params, wait_seconds=wait).body
        runs = api.get(task_path(task_id, "/runs")).body["runs"]
    if json:
        print_json({**answer, "runs": runs})
        return
    task, latest = answer["task"], answer.get("latest_run") or {}
    print_fields(
        [
            ("id", task["id"]),
            ("name", task["name"]),
            ("status", task["status"]),
            ("queue", task["queue_name"]),
            ("priority", task["priority"]),
            ("tenant", task["tenant_id"]),
            ("dedup key", task["dedup_key"]),
            ("attempts", task["attempts"]),
            ("retries", f"{task['retries']} of {task['max_retries']} spent in this delivery cycle"),
            ("run at (UTC)", when(task["run_at"])),
            ("created (UTC)", when(task["created_at"])),
            ("updated (UTC)", when(task["updated_at"])),
            ("trace id", task.get("trace_id")),
            ("payload", orjson.dumps(task.get("payload")).decode()),
            ("result", orjson.dumps(latest["result"]).decode() if latest.get("result") is not None else None),
        ]
    )
    say("")
    print_table(
        ("ATTEMPT", "STATUS", "WORKER", "STARTED (UTC)", "TOOK", "ERROR"),
        [
            (
                r["attempt"],
                r["status"],
                r["worker_id"],
                when(r["started_at"]),
                _took(r),
                one_line(r.get("error")),
            )
            for r in runs
        ],
        title="runs",
    )
    tb = runs[-1].get("traceback") if runs else None
    if tb:
        say("")
        say(f"traceback of attempt {runs[-1]['attempt']}:")
        say(tb.rstrip(), newlines=True)


@app.command("retry")
def retry(
    task_ids: TaskIds,
    priority: Annotated[
        int | None, typer.Option("--priority", min=0, max=1000, help="A new priority (0 to 1000).", metavar="PRIORITY")
    ] = None,
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", help="Move the task to this queue.", metavar="QUEUE")
    ] = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """Queue failed or cancelled tasks again, due now, with a fresh retry budget.

    A task in any other state is refused (exit 4) and the others go on.

    Examples:

    ```
    taskmesh tasks retry 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f
    taskmesh tasks retry ID1 ID2 --priority 500 --queue urgent
    ```
    """
    body: dict[str, Any] = {}
    if priority is not None:
        body["priority"] = priority
    if queue is not None:
        body["queue_name"] = queue

    def one(api: Api, task_id: str) -> tuple[dict[str, Any], str]:
        answer = api.post(task_path(task_id, "/retry"), body).body
        return answer, f"{task_id}: {answer['previous_status']} -> queued on {answer['queue_name']}"

    _each(url, api_key, task_ids, json, one)


@app.command("cancel")
def cancel(task_ids: TaskIds, url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False) -> None:
    """Cancel tasks: a queued one never runs; a running one is cancelled on its worker.

    A finished task is refused (exit 4) and the others go on.

    Examples:

    ```
    taskmesh tasks cancel 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f
    taskmesh tasks list -s queued -q reports --json | jq -r '.tasks[].id' | xargs taskmesh tasks cancel
    ```
    """

    def one(api: Api, task_id: str) -> tuple[dict[str, Any], str]:
        answer = api.post(task_path(task_id, "/cancel")).body
        if answer["status"] == "cancelled":
            return answer, f"{task_id}: cancelled"
        return answer, f"{task_id}: running, its worker was asked to cancel it"

    _each(url, api_key, task_ids, json, one)


@app.command("delete")
def delete(
    task_ids: TaskIds,
    reason: bulk.Reason = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """Delete finished tasks (completed, failed or cancelled) and all their runs, saying why.

    Deleting cannot be undone, so it needs --reason, kept in the audit log (exit 2 without one).
    A queued or running task is refused (exit 4: cancel it first) and the others go on.

    Examples:

    ```
    taskmesh tasks delete 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f --reason "GDPR erasure request 118"
    ```
    """
    why = bulk.required_reason(reason, "deleting")

    def one(api: Api, task_id: str) -> tuple[dict[str, Any], str]:
        api.delete(task_path(task_id), [("reason", why)])
        return {"task_id": task_id, "deleted": True}, f"{task_id}: deleted"

    _each(url, api_key, task_ids, json, one)


def _each(url: str | None, api_key: str | None, task_ids: list[str], json: bool, one: Any) -> None:
    """Act on each id in turn; report each refusal and end with the first refusal's exit status.

    With ``--json`` each outcome is one line: the API's answer, or ``{"task_id", "error", "status"}``.
    """
    first_error: ApiError | None = None
    with Api(url, api_key) as api:
        for task_id in task_ids:
            try:
                answer, line = one(api, task_id)
            except ApiError as exc:
                if exc.status is None:
                    raise
                first_error = first_error or exc
                if json:
                    print_json({"task_id": task_id, "error": str(exc), "status": exc.status})
                else:
                    note(f"taskmesh: error: {task_id}: {exc}")
                continue
            if json:
                print_json(answer)
            else:
                say(line)
    if first_error is not None:
        raise typer.Exit(int(first_error.exit_code))


def _took(run: dict[str, Any]) -> str | None:
    if not run.get("started_at") or not run.get("finished_at"):
        return None
    return duration(datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"]))


def _seconds(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)
