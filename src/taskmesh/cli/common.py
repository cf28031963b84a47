"""Options the operator verbs share (``--url``, ``--api-key``, ``--json``) and the search filter flags.

The filter flags are the search's filters of ``GET /api/v1/tasks`` under their flag
names; ``tasks list`` and the ``bulk`` verbs both take them, so one filter finds the
tasks and then acts on exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import orjson
import typer

from taskmesh.cli.api import DEFAULT_URL

CONNECTION = "Connection"
"""The help panel of ``--url`` and ``--api-key``: taken before the command (``taskmesh --url URL tasks
list``) or after it (``taskmesh tasks list --url URL``), the one after it winning."""

Url = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="TASKMESH_URL",
        show_envvar=True,
        help=f"Base URL of the instance's HTTP API (default: {DEFAULT_URL}).",
        metavar="URL",
        rich_help_panel=CONNECTION,
    ),
]
ApiOrStoresUrl = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="TASKMESH_URL",
        show_envvar=True,
        help="Go through the HTTP API of the instance at this URL, as the API key may; without a URL, "
        "through the stores directly (DATABASE_URL).",
        metavar="URL",
        rich_help_panel=CONNECTION,
    ),
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="TASKMESH_API_KEY",
        show_envvar=True,
        help="The API key sent to the API (tmk_ID_SECRET, as taskmesh keys create printed it); better in "
        "TASKMESH_API_KEY than on a command line others can read.",
        metavar="KEY",
        rich_help_panel=CONNECTION,
    ),
]

Json = Annotated[
    bool,
    typer.Option("--json", help="Print the API's JSON answer on one line instead of a table (for scripts)."),
]
StoresJson = Annotated[bool, typer.Option("--json", help="Print JSON on one line instead of a table (for scripts).")]

Status = Annotated[
    list[str] | None,
    typer.Option(
        "--status",
        "-s",
        help="Task status: queued, running, completed, failed or cancelled; repeat for several.",
        metavar="STATUS",
    ),
]
Queue = Annotated[str | None, typer.Option("--queue", "-q", help="Only tasks of this queue.", metavar="QUEUE")]
Name = Annotated[str | None, typer.Option("--name", "-n", help="Only tasks of this task name.", metavar="NAME")]
Tenant = Annotated[str | None, typer.Option("--tenant-id", help="Only tasks of this tenant id.", metavar="TENANT")]
DedupKey = Annotated[str | None, typer.Option("--dedup-key", help="Only the task with this dedup key.", metavar="KEY")]
ErrorText = Annotated[
    str | None,
    typer.Option(
        "--error", "-e", help="Only tasks whose latest run's error contains this text (any case).", metavar="TEXT"
    ),
]
CreatedAfter = Annotated[
    str | None, typer.Option("--created-after", help="Created at or after this ISO 8601 time.", metavar="TIME")
]
CreatedBefore = Annotated[
    str | None, typer.Option("--created-before", help="Created before this ISO 8601 time.", metavar="TIME")
]
FinishedAfter = Annotated[
    str | None, typer.Option("--finished-after", help="Finished at or after this ISO 8601 time.", metavar="TIME")
]
FinishedBefore = Annotated[
    str | None, typer.Option("--finished-before", help="Finished before this ISO 8601 time.", metavar="TIME")
]
Payload = Annotated[
    list[str] | None,
    typer.Option(
        "--payload",
        "-p",
        help='Payload field equal to a value, FIELD.PATH=VALUE (customer.id=42, plan="pro"); '
        "numbers, true, false and null match as JSON, other text as a string; repeat for several.",
        metavar="PATH=VALUE",
    ),
]


SINGLE_FILTERS = (
    "queue",
    "name",
    "tenant_id",
    "dedup_key",
    "error",
    "created_after",
    "created_before",
    "finished_after",
    "finished_before",
)
"""The search's filters that take one value (``taskmesh.tasks.search.FILTERS`` but ``status`` and the
paging ones; a test keeps them equal, and this module light: the CLI starts without the stores)."""


@dataclass(frozen=True)
class SearchFilter:
    """The filter flags as given; each ``None`` or empty one is left out."""

    status: list[str] | None = None
    queue: str | None = None
    name: str | None = None
    tenant_id: str | None = None
    dedup_key: str | None = None
    error: str | None = None
    created_after: str | None = None
    created_before: str | None = None
    finished_after: str | None = None
    finished_before: str | None = None
    payload: list[str] | None = None

    def query(self) -> list[tuple[str, str]]:
        """The filter as ``GET /api/v1/tasks`` query parameters (``payload.customer.id=42``).

        :raises typer.BadParameter: a ``--payload`` without ``=``.
        """
        pairs: list[tuple[str, str]] = [("status", s.lower()) for s in self.status or []]
        for key in SINGLE_FILTERS:
            value = getattr(self, key)
            if value is not None:
                pairs.append((key, str(value)))
        for item in self.payload or []:
            path, sep, value = item.partition("=")
            if not sep or not path:
                raise typer.BadParameter(f"{item!r} is not PATH=VALUE (customer.id=42)", param_hint="'--payload'")
            pairs.append((f"payload.{path.removeprefix('payload.')}", value))
        return pairs

    def body(self) -> dict[str, Any]:
        """The filter as a bulk request's ``filter`` object; payload values read as the search reads them.

        :raises typer.BadParameter: as :meth:`query`.
        """
        out: dict[str, Any] = {}
        for name, value in self.query():
            if name == "status":
                out.setdefault("status", []).append(value)
            elif name.startswith("payload."):
                out[name] = _scalar(value)
            else:
                out[name] = value
        return out


def _scalar(text: str) -> Any:
    """A payload filter's value as the search reads it: a JSON number, true, false, null or
    "quoted string", else the text itself."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if isinstance(value, dict | list):
        raise typer.BadParameter(
            "a payload filter's value must be a number, a string, true, false or null", param_hint="'--payload'"
        )
    return value
