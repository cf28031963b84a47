"""Command line: ``python -m taskmesh [run|migrate|dev|schedules]``.

Exit status: 0 after a clean stop; 2 for invalid or missing configuration
(the message names the key); 1 when a migration fails, a store refuses for
good (a database that does not exist), a critical service exhausts its
restart budget, or the emergency exit of a blocked instance; 1 for anything
unexpected.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

import anyio

from taskmesh import __version__, cli_schedules
from taskmesh.config import Settings, check_schedule_tasks, load_settings
from taskmesh.errors import ConfigError, MigrationError, ServiceFailedError, StoreError
from taskmesh.logs import configure
from taskmesh.registry import default_registry, load_modules


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m taskmesh", description="taskmesh distributed task platform")
    parser.add_argument("--version", action="version", version=f"taskmesh {__version__}")
    parser.add_argument("--config", help="TOML config file (default: $TASKMESH_CONFIG or ./taskmesh.toml)")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="run an instance (the default)")
    sub.add_parser("migrate", help="apply database migrations and exit")
    sub.add_parser("dev", help="run on an embedded PostgreSQL and Valkey with the demo handler")
    cli_schedules.add_parser(sub)
    return parser


def _backend_options() -> dict[str, bool]:
    """uvloop when installed (the ``fast`` extra): a quicker event loop, same semantics."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def _run(settings: Settings) -> None:
    from taskmesh import supervisor

    load_modules(settings.handlers)
    check_schedule_tasks(settings, set(default_registry.names()), default_registry.fallback is not None)
    anyio.run(supervisor.run, settings, default_registry, backend_options=_backend_options())


def _migrate(settings: Settings) -> None:
    from taskmesh.store.postgres import migrate_url

    if not settings.database_url:
        raise ConfigError("DATABASE_URL not set: set it in the environment or in taskmesh.toml (database_url)")
    database_url = settings.database_url

    async def go() -> None:
        applied = await migrate_url(database_url)
        print(f"migrations applied: {applied or 'none, schema is up to date'}")

    anyio.run(go)


def _dev(settings: Settings) -> None:
    from taskmesh import supervisor
    from taskmesh.demo import demo_handler
    from taskmesh.dev import embedded_stores

    load_modules(settings.handlers)
    default_registry.fallback = demo_handler()
    with embedded_stores(settings.database_url, settings.redis_url) as (database_url, redis_url):
        settings = settings.model_copy(update={"database_url": database_url, "redis_url": redis_url})
        anyio.run(supervisor.run, settings, default_registry, backend_options=_backend_options())


class _Terminated(BaseException):
    """SIGTERM arrived before the supervisor took over the signals (nothing runs yet)."""


def _terminate_early(signum: int, frame: object) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    # Until the supervisor installs its own handlers, SIGTERM is a clean stop, not a crash;
    # embedded servers already started are still stopped by the context managers on the way out.
    signal.signal(signal.SIGTERM, _terminate_early)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.config:
        os.environ["TASKMESH_CONFIG"] = args.config
    try:
        settings = load_settings()
        command = args.command or "run"
        # The operator's verbs print their answer; only warnings and errors are logged around it.
        configure("warning" if command == "schedules" else settings.log_level, settings.log_format)
        if command == "migrate":
            _migrate(settings)
        elif command == "schedules":
            return cli_schedules.run(settings, args)
        elif command == "dev":
            _dev(settings)
        else:
            _run(settings)
    except ConfigError as exc:
        print(f"taskmesh: error: {exc}", file=sys.stderr)
        return 2
    except (MigrationError, ServiceFailedError, StoreError) as exc:
        # Not an outage: a migration or a store refusing for good, or a critical service that
        # kept crashing. The instance has shut down gracefully; the process manager decides.
        print(f"taskmesh: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except _Terminated:
        return 0
    return 0


def exit_main() -> None:
    """Run :func:`main` and exit; threads of abandoned sync handlers do not hold the exit."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if any(t is not threading.main_thread() and t.is_alive() and not t.daemon for t in threading.enumerate()):
        os._exit(code)
    sys.exit(code)
