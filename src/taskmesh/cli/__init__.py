"""Command line: ``taskmesh`` (or ``python -m taskmesh``).

``run`` (the default), ``dev`` and ``migrate`` run the platform; ``schedules`` acts
on cron schedules through the stores; ``tasks``, ``queues``, ``dlq``, ``workers``
and ``bulk`` are the operator's verbs, which talk to an instance's HTTP API
(``--url`` or ``TASKMESH_URL``, default ``http://127.0.0.1:8080``). Tables for
people, ``--json`` for scripts; the exit statuses are in
:mod:`taskmesh.cli.exit_codes`. Built on Typer (commands, help) and rich (tables,
progress).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Annotated

import typer

from taskmesh import __version__
from taskmesh.cli import bulk, dlq, instance, keys, queues, schedules, tasks
from taskmesh.cli.api import ApiError
from taskmesh.cli.exit_codes import EPILOG, ExitCode
from taskmesh.errors import ConfigError, MigrationError, ServiceFailedError, StoreError

app = typer.Typer(
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
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="TASKMESH_API_KEY",
            help="The API key the operator verbs send (tmk_ID_SECRET, as taskmesh keys create printed it); "
            "better in TASKMESH_API_KEY than on a command line others can read.",
            show_envvar=True,
            metavar="KEY",
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """taskmesh: a distributed task platform, durable in PostgreSQL, dispatched through Redis.

    Run the platform (run, dev, migrate), and operate it from a terminal: the operator verbs
    (tasks, queues, dlq, workers, bulk) talk to an instance's HTTP API at --url or TASKMESH_URL.
    Without a command, runs an instance (as `taskmesh run`). `taskmesh COMMAND --help` tells more.

    Examples:

    ```
    taskmesh dev
    taskmesh tasks list --status failed
    taskmesh queues pause emails --reason "provider outage"
    TASKMESH_URL=http://tm.internal:8080 taskmesh bulk replay --status failed --queue emails
    ```
    """
    if config:
        os.environ["TASKMESH_CONFIG"] = config
    if api_key:
        os.environ["TASKMESH_API_KEY"] = api_key
    if ctx.invoked_subcommand is None:
        instance.run()


app.command("run")(instance.run)
app.command("dev")(instance.dev)
app.command("migrate")(instance.migrate)
app.add_typer(schedules.app, name="schedules")
app.add_typer(tasks.app, name="tasks")
app.add_typer(queues.app, name="queues")
app.add_typer(dlq.app, name="dlq")
app.command("workers")(queues.workers)
app.add_typer(bulk.app, name="bulk")
app.add_typer(keys.app, name="keys")


class _Terminated(BaseException):
    """SIGTERM arrived before the supervisor took over the signals (nothing runs yet)."""


def _terminate_early(signum: int, frame: object) -> None:
    raise _Terminated


def _refused(exc: StoreError) -> bool:
    """A refused password: trying again will not help, though the failure model counts Redis's
    refusal as an outage (an instance waits for the password to be fixed rather than exit)."""
    return exc.detail.startswith("AuthenticationError")


def _error(message: object) -> None:
    print(f"taskmesh: error: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit status (:class:`~taskmesh.cli.exit_codes.ExitCode`)."""
    # Until the supervisor installs its own handlers, SIGTERM is a clean stop, not a crash;
    # embedded servers already started are still stopped by the context managers on the way out.
    signal.signal(signal.SIGTERM, _terminate_early)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        app(args=args, prog_name="taskmesh", standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else ExitCode.FAILED)
    except ConfigError as exc:
        _error(exc)
        return ExitCode.USAGE
    except ApiError as exc:
        _error(exc)
        return exc.exit_code
    except StoreError as exc:
        # The operator's verbs that use the stores: an outage may pass (5), a refusal will not (1).
        _error(exc)
        return ExitCode.UNAVAILABLE if exc.transient and not _refused(exc) else ExitCode.FAILED
    except (MigrationError, ServiceFailedError) as exc:
        # Not an outage: a migration or a store refusing for good, or a critical service that
        # kept crashing. The instance has shut down gracefully; the process manager decides.
        _error(exc)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except _Terminated:
        return ExitCode.OK
    return ExitCode.OK


def exit_main() -> None:
    """Run :func:`main` and exit; threads of abandoned sync handlers do not hold the exit.

    A reader that went away (``taskmesh tasks list | head``) ends the output quietly with status 1
    (Typer's handling of ``EPIPE``).
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if any(t is not threading.main_thread() and t.is_alive() and not t.daemon for t in threading.enumerate()):
        os._exit(int(code))
    sys.exit(int(code))
