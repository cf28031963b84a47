"""The guard of ``taskmesh dev``'s embedded servers: a small process that stops them once dev died or their data went.

``taskmesh dev`` starts it (:class:`Guard`, ``python -m taskmesh.dev.embedded_guard``) before
its embedded servers, in a session of its own, with the read end of a pipe as its
stdin; over that pipe dev names each server it starts or starts again (one JSON
line: name, pid, start time, data directory). The guard stops a server:

- when the pipe ends without a ``release`` line, or its parent changed: dev died
  (SIGKILL, the OOM killer, a closed terminal); it stops them all, then exits;
- when the server's data directory is removed or replaced (checked every
  ``CHECK_SECONDS``, 0.25 s): nothing of it may outlive its data.

Stopping is the server's own fast, clean shutdown (SIGTERM for Valkey, SIGINT for
PostgreSQL's fast mode, which ends open sessions), then SIGKILL to it and its
children (PostgreSQL's backends) after ``GRACE_SECONDS`` (10 s; 2 s once the
directory is gone: there is nothing left to save, and Valkey refuses to exit on
SIGTERM when its final save fails). A pid is signalled only while its start time
is still the one dev named, so a reused pid is never hit. ``release`` (dev
stopped its servers itself) ends the guard without a signal.

Why a process rather than ``PR_SET_PDEATHSIG`` on the servers: both daemonise
(the setting is cleared in a fork's child, and the daemon's parent is not dev),
PostgreSQL runs as another user under root (a change of user clears it too), it
fires when the forking *thread* ends (dev's watcher thread restarts servers), and
it cannot notice a removed directory.

Log events: ``embedded_server_stopped_by_guard`` (warning; ``server``, ``pid``,
``reason``, ``signal``: the one that ended it). The guard writes its lines to
dev's stderr and carries on when that is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import taskmesh
from taskmesh.observability.logs import configure, get_logger

log = get_logger("taskmesh.dev.stack")

CHECK_SECONDS = 0.25
"""Seconds between two looks of the guard at its parent and at the servers' data directories."""
GRACE_SECONDS = 10.0
"""Seconds a server has to exit after its polite signal before it and its children get SIGKILL."""
GONE_GRACE_SECONDS = 2.0
"""The same once its data directory is gone."""
POLITE_SIGNALS = {"valkey": signal.SIGTERM, "postgres": signal.SIGINT}
"""Each server's signal of a fast, clean shutdown (PostgreSQL's SIGTERM would wait for every session to end)."""


def stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` from field 3 (state) on, or ``None`` when there is no such process."""
    try:
        # The command name (field 2) may hold spaces and parentheses; everything after its last ")" splits cleanly.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """The start time of live process ``pid`` in clock ticks since boot, or ``None`` when it is gone or a zombie."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def processes_working_in(directory: Path, *, removed_too: bool = False) -> list[int]:
    """Live processes whose working directory is ``directory``; those this user may not inspect are not counted.

    Every embedded server process works in its data directory (PostgreSQL's in
    ``pg/``, Valkey in ``valkey/``), whatever its pidfile says.

    :param removed_too: also those working in an earlier directory of that path, removed since.
    """
    wanted = {str(directory.resolve())}
    if removed_too:
        wanted.add(f"{directory.resolve()} (deleted)")  # how Linux shows the link to a removed directory
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "cwd") in wanted and start_time(int(entry.name)) is not None:
                    found.append(int(entry.name))
    return found


@dataclass(frozen=True)
class Target:
    """A process to stop: its pid, its start time (as :func:`start_time`) and the signal that asks it to exit."""

    pid: int
    started: int
    polite: signal.Signals

    def alive(self) -> bool:
        """True while the process named at start still runs (a zombie, or a reused pid, is not it)."""
        return start_time(self.pid) == self.started

    def send(self, sig: signal.Signals) -> None:
        """Signal the process if it is still the one named (its children too with SIGKILL: PostgreSQL's backends)."""
        pids = [self.pid]
        if sig == signal.SIGKILL:
            with contextlib.suppress(OSError):
                tasks = Path(f"/proc/{self.pid}/task").iterdir()
                pids += [int(c) for t in tasks for c in (t / "children").read_text().split()]
        if not self.alive():
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def stop_processes(targets: Sequence[Target], grace_seconds: float) -> dict[int, str]:
    """Stop every target: its polite signal, then SIGKILL after ``grace_seconds``; returns once all are gone.

    :returns: by pid, the name of the signal that ended each target that was running (``SIGKILL``
        when it had to be forced); targets already gone are left out.
    """
    ended: dict[int, str] = {}
    for target in targets:
        if target.alive():
            target.send(target.polite)
            ended[target.pid] = target.polite.name
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(t.alive() for t in targets):
        time.sleep(0.05)
    for target in targets:
        if target.alive():
            target.send(signal.SIGKILL)
            ended[target.pid] = "SIGKILL"
    deadline = time.monotonic() + 5  # the kernel ends a SIGKILLed process promptly; bounded all the same
    while time.monotonic() < deadline and any(t.alive() for t in targets):
        time.sleep(0.02)
    return ended


@dataclass(frozen=True)
class _Tracked:
    """A server the guard watches: its process and its data directory's identity (device, inode)."""

    name: str
    target: Target
    directory: Path
    identity: tuple[int, int] | None

    def directory_gone(self) -> bool:
        try:
            found = os.stat(self.directory)
        except OSError:
            return True
        return (found.st_dev, found.st_ino) != self.identity


def _identity(directory: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(directory)
    except OSError:
        return None
    return (found.st_dev, found.st_ino)


def _say(event: str, **keys: object) -> None:
    """Log, unless dev's stderr is gone with dev (a closed pipe): stopping the servers matters more."""
    with contextlib.suppress(OSError, ValueError):
        log.warning(event, **keys)


def _stop(servers: Iterable[_Tracked], reason: str, grace_seconds: float) -> None:
    servers = list(servers)
    ended = stop_processes([s.target for s in servers], grace_seconds)
    for server in servers:
        if server.target.pid in ended:
            _say(
                "embedded_server_stopped_by_guard",
                server=server.name,
                pid=server.target.pid,
                reason=reason,
                signal=ended[server.target.pid],
            )


def _read_lines(fd: int, pending: bytearray) -> list[bytes] | None:
    """The complete lines now readable from ``fd``; ``None`` at its end."""
    chunk = os.read(fd, 65536)
    if not chunk:
        return None
    pending += chunk
    *lines, rest = bytes(pending).split(b"\n")
    pending[:] = rest
    return lines


def _track(tracked: dict[str, _Tracked], line: bytes) -> None:
    """Note the server a ``track`` line names (it replaces the one of that name: a restart)."""
    said = json.loads(line)
    name = str(said["name"])
    target = Target(int(said["pid"]), int(said["started"]), POLITE_SIGNALS.get(name, signal.SIGTERM))
    directory = Path(said["directory"])
    tracked[name] = _Tracked(name, target, directory, _identity(directory))


def guard(fd: int = 0, parent: int | None = None, check_seconds: float = CHECK_SECONDS) -> int:
    """Watch the servers dev names over ``fd`` until dev releases the guard or dies; see the module's docstring.

    :param fd: the read end of dev's pipe.
    :param parent: dev's pid (default: this process's parent); another parent means dev died.
    :param check_seconds: seconds between two looks at the parent and the data directories.
    :returns: 0, the guard's exit status.
    """
    parent = os.getppid() if parent is None else parent
    tracked: dict[str, _Tracked] = {}
    pending = bytearray()
    while True:
        readable, _, _ = select.select([fd], [], [], check_seconds)
        lines = _read_lines(fd, pending) if readable else []
        for line in lines or []:
            if line.strip() == b"release":
                return 0
            if line.strip():
                with contextlib.suppress(ValueError, KeyError, TypeError):  # a guard that crashed would guard nothing
                    _track(tracked, line)
        if lines is None or os.getppid() != parent:
            _stop(tracked.values(), "dev process died", GRACE_SECONDS)
            return 0
        gone = [server for server in tracked.values() if server.directory_gone()]
        if gone:
            _stop(gone, "data directory removed", GONE_GRACE_SECONDS)
            for server in gone:
                tracked.pop(server.name, None)


class Guard:
    """Dev's end of the guard: starts the guard process, names the servers to it, releases it on a clean stop.

    :param log_level: the guard's log level (dev's).
    :param log_format: the guard's log format (dev's: ``json``, ``console`` or ``auto``).
    :raises OSError: the guard process could not be started.
    """

    def __init__(self, log_level: str = "info", log_format: str = "auto") -> None:
        read, self._write = os.pipe()
        env = dict(os.environ)
        # The guard imports the very taskmesh dev runs, wherever that was found.
        source = str(Path(taskmesh.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "taskmesh.dev.embedded_guard", "--log-level", log_level]
        try:
            # Its own session: a Ctrl-C at the terminal reaches dev, which drains before it stops anything.
            self._process = subprocess.Popen(
                [*command, "--log-format", log_format],
                stdin=read,
                stdout=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError:
            os.close(self._write)
            raise
        finally:
            os.close(read)
        self._lost = False

    @property
    def pid(self) -> int:
        """The guard process's pid."""
        return self._process.pid

    def track(self, name: str, pid: int, started: int | None, directory: Path) -> None:
        """Name a server the guard stops when dev dies or ``directory`` goes (again after each restart).

        :param name: ``valkey`` or ``postgres`` (its polite signal follows from it).
        :param pid: the server's main process.
        :param started: its start time (:func:`start_time`); ``None`` (already gone) names nothing.
        :param directory: the server's data directory.
        """
        if started is None:
            return
        line = json.dumps({"name": name, "pid": pid, "started": started, "directory": str(directory)})
        self._send(line)

    def release(self, timeout: float = 5.0) -> None:
        """Tell the guard dev stopped its servers itself, and wait (up to ``timeout`` s) for it to exit."""
        self._send("release")
        with contextlib.suppress(OSError):
            os.close(self._write)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _send(self, line: str) -> None:
        # One write of less than PIPE_BUF bytes: lines from dev's threads never interleave.
        try:
            os.write(self._write, f"{line}\n".encode())
        except OSError as exc:
            if not self._lost:
                self._lost = True
                log.warning("embedded_guard_lost", pid=self._process.pid, error=str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m taskmesh.dev.embedded_guard [--log-level L] [--log-format F]``: run the guard on stdin."""
    parser = argparse.ArgumentParser(prog="taskmesh.dev.embedded_guard")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", default="auto")
    args = parser.parse_args(argv)
    configure(args.log_level, args.log_format)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # dev decides when the servers stop, not a terminal's Ctrl-C
    return guard()


if __name__ == "__main__":
    sys.exit(main())
