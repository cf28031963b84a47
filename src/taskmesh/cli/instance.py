"""``taskmesh run|dev|migrate``: run an instance, run the dev profile, apply migrations."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from taskmesh.errors import ConfigError
from taskmesh.runtime.event_loop import backend_options

if TYPE_CHECKING:
    from taskmesh.config import Settings

# The platform's modules are imported by the commands that run it, not by the operator's verbs,
# which then start in a third of the time.


def _settings() -> Settings:
    from taskmesh.config import load_settings
    from taskmesh.observability.logs import configure

    settings = load_settings()
    configure(settings.log_level, settings.log_format)
    return settings


def run() -> None:
    """Run an instance: the HTTP API and the workers of the configured queues, until SIGTERM or SIGINT.

    Configuration comes from TASKMESH_* and the usual variables (DATABASE_URL, REDIS_URL), and from
    taskmesh.toml; handlers are imported from the modules named by TASKMESH_HANDLERS. SIGTERM drains:
    running tasks finish within the grace period, the rest are handed back. Exit 0 after a clean stop;
    2 for invalid configuration; 1 when a migration fails, a store refuses for good, or a critical
    service keeps crashing.

    Examples:

    ```
    DATABASE_URL=postgresql://app@db/app REDIS_URL=redis://cache:6379/0 TASKMESH_HANDLERS=myapp.tasks taskmesh run
    taskmesh --config /etc/taskmesh/taskmesh.toml run
    ```
    """
    from taskmesh.config import check_schedule_tasks
    from taskmesh.runtime import supervisor
    from taskmesh.tasks.registry import default_registry, load_modules

    settings = _settings()
    load_modules(settings.handlers)
    check_schedule_tasks(settings, set(default_registry.names()), default_registry.fallback is not None)
    anyio.run(supervisor.run, settings, default_registry, backend_options=backend_options())


def worker() -> None:
    """Run an instance's workers without HTTP: what ``pip install taskmesh`` runs, with no extra.

    As ``taskmesh run`` with ``http_enabled`` and ``api_enabled`` off: the fetchers, executors,
    scheduler and maintenance services of the configured queues, and no port at all (no
    ``/healthz``, ``/readyz`` or ``/metrics``: the worker's heartbeat row, ``taskmesh workers``
    elsewhere and systemd's watchdog say it lives). Configuration and exit statuses as ``run``.

    Examples:

    ```
    DATABASE_URL=postgresql://app@db/app REDIS_URL=redis://cache:6379/0 TASKMESH_HANDLERS=myapp.tasks taskmesh worker
    python -m taskmesh worker
    ```
    """
    from taskmesh.config import check_schedule_tasks
    from taskmesh.runtime import supervisor
    from taskmesh.tasks.registry import default_registry, load_modules

    settings = _settings().model_copy(update={"http_enabled": False, "api_enabled": False, "metrics_port": None})
    load_modules(settings.handlers)
    check_schedule_tasks(settings, set(default_registry.names()), default_registry.fallback is not None)
    anyio.run(supervisor.run, settings, default_registry, backend_options=backend_options())


def dev() -> None:
    """Run one instance on an embedded PostgreSQL and Valkey, with the demo handler for unknown task names.

    Nothing to install or start: the stores' data lives in TASKMESH_DEV_DIR (default: ./.taskmesh)
    and their ports stay the same across restarts; the URLs are logged as dev_stores.
    The API listens on http://127.0.0.1:8080.

    Examples:

    ```
    taskmesh dev
    TASKMESH_DEV_DIR=/tmp/tm TASKMESH_HANDLERS=myapp.tasks taskmesh dev
    ```
    """
    from taskmesh.dev.demo import demo_handler
    from taskmesh.dev.stack import embedded_stores
    from taskmesh.runtime import supervisor
    from taskmesh.tasks.registry import default_registry, load_modules

    settings = _settings()
    load_modules(settings.handlers)
    default_registry.fallback = demo_handler()
    if settings.worker_processes != 1:
        from taskmesh.observability.logs import get_logger

        get_logger("taskmesh.dev.stack").warning(
            "worker_processes_ignored", worker_processes=settings.worker_processes, reason="taskmesh dev runs one"
        )
    with embedded_stores(
        settings.database_url, settings.redis_url, log_level=settings.log_level, log_format=settings.log_format
    ) as (database_url, redis_url):
        # One process: the embedded stores' URLs are this process's to give, and a trial needs no more.
        update = {"database_url": database_url, "redis_url": redis_url, "worker_processes": 1}
        settings = settings.model_copy(update=update)
        anyio.run(supervisor.run, settings, default_registry, backend_options=backend_options())


def migrate() -> None:
    """Apply the database migrations DATABASE_URL lacks, then exit (instances also do it at start).

    Safe to run from several places at once: an advisory lock lets one apply them.

    Examples:

    ```
    DATABASE_URL=postgresql://app@db/app taskmesh migrate
    ```
    """
    from taskmesh.store.postgres import migrate_url

    settings = _settings()
    if not settings.database_url:
        raise ConfigError("DATABASE_URL not set: set it in the environment or in taskmesh.toml (database_url)")
    database_url = settings.database_url

    async def go() -> None:
        run = await migrate_url(database_url, pooler=settings.pg_pooler)
        if run.applied or run.held:
            print(f"migrations applied: {run.applied or 'none'}")
        else:
            print("migrations applied: none, schema is up to date")
        if run.held:
            print(
                f"held back until no instance of another version runs: {run.held}"
                f" (live: {', '.join(run.held_by)}); run `taskmesh migrate` again once they have stopped"
            )

    anyio.run(go)
