"""The command line's commands: ``taskmesh`` (or ``python -m taskmesh``), built on Typer.

``run`` (the default), ``dev`` and ``migrate`` run the platform; ``tasks``,
``workflows``, ``queues``, ``limits``, ``dlq``, ``workers`` and ``bulk`` are the operator's verbs, which
talk to an instance's HTTP API (``--url`` or ``TASKMESH_URL``, default
``http://127.0.0.1:8080``, with the key of ``--api-key`` or ``TASKMESH_API_KEY``;
both flags before or after the command); ``schedules`` and ``keys`` talk to that
API when given a URL and to the stores directly without one. Tables for people,
``--json`` for scripts; the exit statuses are in
:mod:`taskmesh.cli.exit_codes`. Built on Typer (commands, help) and rich (tables,
progress).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from taskmesh import __version__
from taskmesh.cli import bulk, common, dlq, exits, instance, keys, limits, queues, schedules, tasks, workflows
from taskmesh.cli.api import ApiError
from taskmesh.cli.apps import App
from taskmesh.cli.exit_codes import EPILOG

app = App(
    name="taskmesh",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"taskmesh {__version__}")
        raise typer.Exit()


PLATFORM = {None: "run", "run": "run", "worker": "worker", "dev": "dev", "migrate": "migrate"}
"""The commands that run the platform rather than talk to an instance (``None``: no command, ``run``)."""


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="TOML config file (default: $TASKMESH_CONFIG, else ./taskmesh.toml when present).",
            metavar="FILE",
        ),
    ] = None,
    url: common.Url = None,
    api_key: common.ApiKey = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """taskmesh: a distributed task platform, durable in PostgreSQL, dispatched through Redis.

    Run the platform (run, dev, migrate), and operate it from a terminal: the operator verbs
    (tasks, workflows, queues, limits, dlq, workers, bulk) talk to an instance's HTTP API at --url or
    TASKMESH_URL, with the key of --api-key or TASKMESH_API_KEY (both given before or after the command);
    schedules and keys do too when given a URL, and talk to the stores directly without one.
    Without a command, runs an instance (as `taskmesh run`). `taskmesh COMMAND --help` tells more.

    Examples:

    ```
    taskmesh dev
    taskmesh tasks list --status failed
    taskmesh --url http://tm.internal:8080 queues pause emails --reason "provider outage"
    TASKMESH_URL=http://tm.internal:8080 taskmesh bulk replay --status failed --queue emails
    ```
    """
    if ctx.invoked_subcommand in PLATFORM:
        _refuse_connection_flags(ctx, PLATFORM[ctx.invoked_subcommand])
    if config:
        os.environ["TASKMESH_CONFIG"] = config
    # Into the environment, where each command's own --url and --api-key (which win) read their default.
    if url:
        os.environ["TASKMESH_URL"] = url
    if api_key:
        os.environ["TASKMESH_API_KEY"] = api_key
    if ctx.invoked_subcommand is None:
        instance.run()


def _refuse_connection_flags(ctx: typer.Context, command: str) -> None:
    """Refuse ``--url`` and ``--api-key`` on the command line of a command that runs the platform: it
    would not use them (from the environment they are left alone: exported for the other commands).

    :raises typer.BadParameter: either flag given (exit 2).
    """
    for name, flag in (("url", "--url"), ("api_key", "--api-key")):
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":
            raise typer.BadParameter(
                f"{flag} is for the commands that talk to an instance's API (tasks, workflows, queues, limits, dlq, "
                f"workers, bulk, schedules, keys); `taskmesh {command}` runs the platform on the stores of its "
                "configuration",
                param_hint=f"'{flag}'",
            )


app.command("run")(instance.run)
app.command("worker")(instance.worker)
app.command("dev")(instance.dev)
app.command("migrate")(instance.migrate)
app.add_typer(schedules.app, name="schedules")
app.add_typer(tasks.app, name="tasks")
app.add_typer(workflows.app, name="workflows")
app.add_typer(queues.app, name="queues")
app.add_typer(limits.app, name="limits")
app.add_typer(dlq.app, name="dlq")
app.command("workers")(queues.workers)
app.add_typer(bulk.app, name="bulk")
app.add_typer(keys.app, name="keys")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit status (:class:`~taskmesh.cli.exit_codes.ExitCode`, see
    :func:`taskmesh.cli.exits.run`; an operator's verb whose API call failed: the status it names)."""
    args = list(sys.argv[1:] if argv is None else argv)

    def command() -> None:
        try:
            app(args=args, prog_name="taskmesh", standalone_mode=True)
        except ApiError as exc:
            exits.error(exc)
            raise SystemExit(exc.exit_code) from exc

    return exits.run(command)


def exit_main() -> None:
    """Run :func:`main` and exit (:func:`taskmesh.cli.exits.exit_process`).

    A reader that went away (``taskmesh tasks list | head``) ends the output quietly with status 1
    (Typer's handling of ``EPIPE``).
    """
    exits.exit_process(main())
