"""``taskmesh workflows list|show|cancel|retry``: find workflows, see one node by node, act on one, via the API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import orjson
import typer

from taskmesh.cli import common
from taskmesh.cli.api import Api, task_path, workflow_path
from taskmesh.cli.apps import App
from taskmesh.cli.exit_codes import EPILOG
from taskmesh.cli.output import note, one_line, print_fields, print_json, print_table, say, when

app = App(
    help="Find workflows (graphs of tasks), show one node by node, and cancel or retry one.",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

WorkflowId = Annotated[str, typer.Argument(help="The workflow's id (a UUID).", metavar="ID")]

ERRORS_READ = 20
"""Most failed nodes whose task's error ``show`` reads (one request each) for its table."""
COUNT_ORDER = ("blocked", "queued", "running", "completed", "failed", "cancelled", "skipped")
"""Task statuses in the order a person reads a workflow's progress; any other status the API
names is printed after them, by name."""


@app.command("list")
def list_workflows(
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Only workflows of this name.", metavar="NAME")
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status", "-s", help="Only workflows running, completed, failed or cancelled.", metavar="STATUS"
        ),
    ] = None,
    tenant_id: Annotated[
        str | None, typer.Option("--tenant-id", help="Only workflows of this tenant id.", metavar="TENANT")
    ] = None,
    created_after: common.CreatedAfter = None,
    created_before: common.CreatedBefore = None,
    limit: Annotated[
        int, typer.Option("--limit", "-l", min=1, max=500, help="Workflows per page (1 to 500).", metavar="N")
    ] = 50,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Go on from a previous page (its next_cursor).", metavar="CURSOR")
    ] = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """List workflows newest first, one page at a time, with how many of their tasks are in each status.

    The next page's cursor is printed under the table.

    Examples:

    ```
    taskmesh workflows list --status failed
    taskmesh workflows list --name nightly-report --created-after 2026-12-01T00:00:00Z
    taskmesh workflows list --status running --json | jq -r '.workflows[].workflow_id'
    ```
    """
    given = {
        "name": name,
        "status": status.lower() if status else None,
        "tenant_id": tenant_id,
        "created_after": created_after,
        "created_before": created_before,
        "cursor": cursor,
    }
    params = [(k, v) for k, v in given.items() if v is not None]
    params.append(("limit", str(limit)))
    with Api(url, api_key) as api:
        page = api.get("/api/v1/workflows", params).body
    if json:
        print_json(page)
        return
    rows = [
        (
            w["workflow_id"],
            w["name"],
            w["status"],
            w.get("tenant_id"),
            when(w["created_at"]),
            when(w.get("finished_at")),
            counts_text(w.get("counts") or {}),
        )
        for w in page["workflows"]
    ]
    print_table(("ID", "NAME", "STATUS", "TENANT", "CREATED (UTC)", "FINISHED (UTC)", "TASKS"), rows)
    if page.get("next_cursor"):
        note(f"next page: --cursor {page['next_cursor']}")
    elif not rows:
        note("no workflow matches")


@app.command("show")
def show(
    workflow_id: WorkflowId, url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False
) -> None:
    """Show a workflow: its fields, its tasks' counts, and a table of its nodes.

    Each node's row has its kind, its state (blocked, running, succeeded, failed, skipped or
    cancelled), its deps, the deps it still waits for, and its task's id (a map
    node: its tasks' counts), with its error (a failed task's: its latest run's).

    Examples:

    ```
    taskmesh workflows show 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f
    taskmesh workflows show 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f --json | jq '.nodes[] | select(.state == "failed")'
    ```
    """
    with Api(url, api_key) as api:
        wf = api.get(workflow_path(workflow_id)).body
        if json:
            print_json(wf)
            return
        errors = _task_errors(api, wf["nodes"])
    print_fields(
        [
            ("id", wf["workflow_id"]),
            ("name", wf["name"]),
            ("status", wf["status"]),
            ("tenant", wf.get("tenant_id")),
            ("dedup key", wf.get("dedup_key")),
            ("trace id", wf.get("trace_id")),
            ("created (UTC)", when(wf["created_at"])),
            ("updated (UTC)", when(wf.get("updated_at"))),
            ("finished (UTC)", when(wf.get("finished_at"))),
            ("cancel reason", wf.get("cancel_reason")),
            ("context", orjson.dumps(wf["context"]).decode() if wf.get("context") is not None else None),
            ("tasks", counts_text(wf.get("counts") or {}) or "none"),
        ]
    )
    say("")
    print_table(
        ("NODE", "KIND", "STATE", "DEPS", "WAITING FOR", "TASK", "ERROR"),
        [
            (
                n["id"],
                n["kind"],
                n["state"],
                ", ".join(n.get("deps") or []) or None,
                ", ".join(n.get("waiting_for") or []) or None,
                _node_tasks(n),
                one_line(n.get("error") or errors.get(n["id"])),
            )
            for n in wf["nodes"]
        ],
        title="nodes",
    )


@app.command("cancel")
def cancel(
    workflow_id: WorkflowId,
    reason: Annotated[
        str | None,
        typer.Option("--reason", "-r", help="Why (kept with the workflow and in the audit log).", metavar="TEXT"),
    ] = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """Cancel a workflow: its tasks not started never run, its running ones are cancelled on their workers.

    Cancelling a cancelled workflow again does nothing (exit 0); a completed or failed one is
    refused (exit 4).

    Examples:

    ```
    taskmesh workflows cancel 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f --reason "wrong input file"
    ```
    """
    body = {"reason": reason} if reason is not None else {}
    with Api(url, api_key) as api:
        answer = api.post(workflow_path(workflow_id, "/cancel"), body).body
    if json:
        print_json(answer)
        return
    say(
        f"{answer['workflow_id']}: {answer['status']}; {answer['cancelled']} tasks cancelled, "
        f"{answer['cancel_requested']} running tasks asked to stop"
    )


@app.command("retry")
def retry(
    workflow_id: WorkflowId, url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False
) -> None:
    """Run a failed or cancelled workflow again from where it stopped.

    Its failed, cancelled and skipped tasks wait again for their deps with a fresh retry budget
    (those whose deps completed are queued at once); its completed tasks keep their results and
    do not run again. A running or completed workflow is refused (exit 4), and so is a cancelled
    one whose tasks are still stopping.

    Examples:

    ```
    taskmesh workflows retry 0f8b2c1e-5a4d-4c3b-9f1e-2d7a6b5c4e3f
    ```
    """
    with Api(url, api_key) as api:
        answer = api.post(workflow_path(workflow_id, "/retry")).body
    if json:
        print_json(answer)
        return
    say(
        f"{answer['workflow_id']}: {answer['status']}; {answer['requeued']} tasks queued again, "
        f"{answer['reblocked']} waiting for them again"
    )


def _task_errors(api: Api, nodes: list[dict[str, Any]]) -> dict[str, str]:
    """The latest run's error of the task of each failed node that has one task, by node id.

    A node's own ``error`` says only why the node itself failed (a map whose source gave no list);
    why its task failed is on the task's run, one request each: at most :data:`ERRORS_READ` are
    read, with a note on stderr when more failed.
    """
    failed = [n for n in nodes if n["state"] == "failed" and not n.get("error") and n.get("task_id")]
    out: dict[str, str] = {}
    for node in failed[:ERRORS_READ]:
        run = api.get(task_path(str(node["task_id"]))).body.get("latest_run") or {}
        if run.get("error"):
            out[node["id"]] = run["error"]
    if len(failed) > ERRORS_READ:
        note(f"errors read for the first {ERRORS_READ} failed nodes; `taskmesh tasks show ID` tells the others'")
    return out


def counts_text(counts: Mapping[str, int]) -> str:
    """Task counts by status for a cell: ``completed 3, running 1`` (known statuses first, zeros left out)."""
    order = [s for s in COUNT_ORDER if s in counts] + sorted(s for s in counts if s not in COUNT_ORDER)
    return ", ".join(f"{status} {counts[status]}" for status in order if counts[status])


def _node_tasks(node: Mapping[str, Any]) -> str | None:
    """A node's TASK cell: its task id, or for a map node how many tasks it has and their counts."""
    if node.get("kind") == "map":
        ids = node.get("task_ids") or []
        counts = counts_text(node.get("counts") or {})
        return f"{len(ids)} tasks" + (f": {counts}" if counts else "")
    task_id = node.get("task_id")
    return None if task_id is None else str(task_id)
