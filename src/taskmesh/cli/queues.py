"""``taskmesh queues list|show|pause|resume`` and ``taskmesh workers``, through the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from taskmesh.cli import common
from taskmesh.cli.api import Api, queue_path
from taskmesh.cli.apps import App
from taskmesh.cli.exit_codes import EPILOG
from taskmesh.cli.output import ago, duration, note, print_fields, print_json, print_table, say, when

app = App(
    help="See queues (depth by state, age, workers, runs per minute) and pause or resume them.",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

QueueName = Annotated[str, typer.Argument(help="The queue's name.", metavar="QUEUE")]


def _state(q: dict[str, Any]) -> str:
    return "paused" if q["paused"] else "active"


@app.command("list")
def list_queues(url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False) -> None:
    """List every queue that has tasks or is served: depth by state, oldest ready age, workers, runs.

    DONE/MIN and FAILED/MIN count the runs that ended in the last whole minute.

    Examples:

    ```
    taskmesh queues list
    taskmesh queues list --json | jq '.queues[] | select(.paused)'
    ```
    """
    with Api(url, api_key) as api:
        answer = api.get("/api/v1/queues").body
    if json:
        print_json(answer)
        return
    rows = []
    for q in answer["queues"]:
        d, last = q["depth"], q["runs"]["last_minute"]
        rows.append(
            (
                q["queue"],
                _state(q),
                d["ready"],
                d["delayed"],
                d["running"],
                d["retrying"],
                d["dead_letter"],
                duration(q["oldest_ready_age_seconds"]) if d["ready"] else None,
                len(q["workers"]),
                q["concurrency"],
                last["succeeded"],
                last["failed"],
            )
        )
    print_table(
        (
            "QUEUE",
            "STATE",
            "READY",
            "DELAYED",
            "RUNNING",
            "RETRYING",
            "DEAD",
            "OLDEST READY",
            "WORKERS",
            "CONCURRENCY",
            "DONE/MIN",
            "FAILED/MIN",
        ),
        rows,
    )
    if not rows:
        note("no queue has tasks or is served")


@app.command("show")
def show(queue: QueueName, url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False) -> None:
    """Show one queue: its state, depth by state, the instances serving it and its runs per minute.

    Examples:

    ```
    taskmesh queues show emails
    ```
    """
    with Api(url, api_key) as api:
        q = api.get(queue_path(queue)).body
    if json:
        print_json(q)
        return
    d, last, this = q["depth"], q["runs"]["last_minute"], q["runs"]["this_minute"]
    print_fields(
        [
            ("queue", q["queue"]),
            ("state", _state(q) + (f" since {when(q['paused_at'])} UTC" if q["paused"] else "")),
            ("reason", q["reason"]),
            ("ready", d["ready"]),
            ("delayed", d["delayed"]),
            ("running", d["running"]),
            ("retrying", d["retrying"]),
            ("dead-lettered", d["dead_letter"]),
            ("oldest ready", duration(q["oldest_ready_age_seconds"]) if d["ready"] else None),
            ("concurrency", q["concurrency"]),
            ("last minute", ", ".join(f"{k} {v}" for k, v in last.items())),
            ("this minute", ", ".join(f"{k} {v}" for k, v in this.items())),
        ]
    )
    say("")
    print_table(
        ("WORKER", "STATE", "CONCURRENCY"),
        [(w["worker_id"], w["state"], w["concurrency"]) for w in q["workers"]],
        title="served by",
    )


@app.command("pause")
def pause(
    queue: QueueName,
    reason: Annotated[
        str | None,
        typer.Option("--reason", "-r", help="Why, shown with the queue (up to 500 characters).", metavar="TEXT"),
    ] = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    json: common.Json = False,
) -> None:
    """Pause a queue on every instance: no new run starts; running ones finish; enqueue still works.

    The pause is kept in PostgreSQL, so it outlives restarts until resumed.

    Examples:

    ```
    taskmesh queues pause emails --reason "provider outage"
    ```
    """
    with Api(url, api_key) as api:
        q = api.post(queue_path(queue, "/pause"), {"reason": reason} if reason is not None else None).body
    if json:
        print_json(q)
    else:
        say(f"{queue}: paused" + (f" ({q['reason']})" if q.get("reason") else ""))


@app.command("resume")
def resume(queue: QueueName, url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False) -> None:
    """Resume a paused queue: every instance serving it starts claiming again within a second.

    Examples:

    ```
    taskmesh queues resume emails
    ```
    """
    with Api(url, api_key) as api:
        q = api.post(queue_path(queue, "/resume")).body
    if json:
        print_json(q)
    else:
        say(f"{queue}: active")


def workers(url: common.Url = None, api_key: common.ApiKey = None, json: common.Json = False) -> None:
    """List the instances: their queues and concurrency, runs in flight, heartbeat age and state.

    Also names queues that have ready tasks and no instance serving them, and paused queues.

    Examples:

    ```
    taskmesh workers
    taskmesh workers --json | jq '.workers[] | select(.state != "running")'
    ```
    """
    with Api(url, api_key) as api:
        answer = api.get("/api/v1/workers").body
    if json:
        print_json(answer)
        return
    print_table(
        ("WORKER", "HOST", "PID", "STATE", "QUEUES", "IN FLIGHT", "HEARTBEAT", "STARTED (UTC)", "VERSION"),
        [
            (
                w["id"],
                w["host"],
                w["pid"],
                w["state"],
                " ".join(f"{name}:{n}" for name, n in sorted(w["queues"].items())),
                w["in_flight"],
                (ago(w["heartbeat_at"]) or "-") + " ago",
                when(w["started_at"]),
                w["version"],
            )
            for w in answer["workers"]
        ],
    )
    if answer.get("unserved_queues"):
        unserved = ", ".join(f"{q['queue']} ({q['queued']} queued)" for q in answer["unserved_queues"])
        note(f"queues with work and no instance serving them: {unserved}")
    if answer.get("paused_queues"):
        note("paused queues: " + ", ".join(q["queue"] for q in answer["paused_queues"]))
