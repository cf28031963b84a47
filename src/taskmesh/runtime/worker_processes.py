"""Worker processes: ``worker_processes`` above 1 has ``taskmesh run`` work its queues on every core.

An instance's event loop runs on one core, so async handlers, the claims and the commits of
one instance never use more than one. With ``worker_processes = N`` the process the operator
started (the *primary*) runs as it always does (API, scheduler, maintenance, its own fetchers
and executors) and starts N - 1 more instances of its settings as its children, each
worker-only (``api_enabled`` and ``scheduler_enabled`` off): an event loop, connections to
the stores, a worker row, a heartbeat and leases of its own, so that what taskmesh promises
between any two instances (one claim per attempt, fencing, reclaim) holds between them. Child
``k`` (1 to N - 1) serves ``/healthz``, ``/readyz`` and ``/metrics`` on ``http_port + k``
(and its metrics listener on ``metrics_port + k``), or on a free port when ``http_port`` is 0.

Supervision: each child is a critical service of the primary, a row of its service table
(:mod:`taskmesh.runtime.services_table`; ``worker_process:k`` in
``taskmesh_service_up``, and listed in ``/readyz`` while it is down, which still answers 200:
the primary's API and workers serve on). A child that exits while the primary runs is logged
(``worker_process_exited``: pid, exit status) and started again after the crash policy's
backoff (``services.supervision``); past the restart budget the primary shuts down and exits 1.

Stop: in the primary's intake stop phase, right after its scheduler stopped, every child is sent
SIGTERM at once, so that all drain in the same grace period; so is a second signal (the grace ends
at once). The primary's results phase waits for the children's end. Each child runs in a session
of its own, so that a terminal's Ctrl-C (sent to the whole foreground group) reaches it once,
through the primary; under systemd, ``KillMode=mixed`` (``deploy/systemd``) does the same. The
primary exits after its children, each given the grace period and 15 s more before SIGKILL.

A child's settings come on its stdin, one line of JSON (not in its environment, which the
processes its handlers start would inherit, passwords included); that connection (a socket
pair) stays open and silent, so the primary's end, even by SIGKILL, is an end of file there,
which the child takes as one SIGTERM: it drains and hands back its runs as after a stop.

Log events: ``worker_process_started`` (index, pid), ``worker_process_exited`` (index, pid,
exit: "exit code 2", "signal SIGKILL"; warning), ``worker_process_stopped`` (index, pid, exit),
``worker_process_killed`` (index, pid, after_s; error: still running past its bound, SIGKILLed),
and from a child ``worker_process_orphaned`` (parent; warning).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from functools import partial
from typing import TYPE_CHECKING

import anyio
import orjson

from taskmesh.errors import TaskmeshError
from taskmesh.observability.logs import get_logger
from taskmesh.services.supervision import ServiceSpec

if TYPE_CHECKING:
    from anyio.abc import Process

    from taskmesh.config import Settings

log = get_logger("taskmesh.runtime.worker_processes")

PARENT_VARIABLE = "TASKMESH_WORKER_PROCESS_PARENT"
"""The environment variable naming the primary's pid (the child logs it when the primary is gone)."""
STOP_MARGIN_SECONDS = 15.0
"""What a stopping child gets on top of the grace period before SIGKILL (an instance's own bound)."""


class WorkerProcessExitedError(TaskmeshError, RuntimeError):
    """A worker process ended while the primary was running (the crash policy starts it again)."""

    def __init__(self, index: int, pid: int, exit_status: str) -> None:
        super().__init__(f"worker process {index} (pid {pid}) exited: {exit_status}")


def describe_exit(returncode: int) -> str:
    """``"exit code 2"`` or ``"signal SIGKILL"`` for a ``returncode`` as :mod:`subprocess` gives it."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def child_port(port: int | None, index: int) -> int | None:
    """Child ``index``'s port for the primary's ``port``: the next ones up, a free one for 0, none for none."""
    if port is None or port == 0:
        return port
    return port + index


def child_settings(settings: Settings, index: int) -> dict[str, object]:
    """The settings of child ``index`` (1 to N - 1) as JSON data: the primary's, worker-only, its own ports.

    Migrations stay on: under their advisory lock, a child that starts first applies them and the others wait.
    """
    data: dict[str, object] = settings.model_dump(mode="json")
    data.update(
        worker_processes=1,
        api_enabled=False,
        scheduler_enabled=False,
        http_port=child_port(settings.http_port, index),
        metrics_port=child_port(settings.metrics_port, index),
    )
    return data


def child_environment() -> dict[str, str]:
    """The environment a child starts with: this process's but systemd's notify socket, plus the primary's pid.

    Its settings (passwords included) come on its stdin instead (:func:`run`), where no process its
    handlers start can read them.
    """
    # systemd hears from the primary alone: a child's READY=1 or watchdog ping would speak for the service.
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env[PARENT_VARIABLE] = str(os.getpid())
    return env


def specs(settings: Settings, stop: anyio.Event, force: anyio.Event) -> list[ServiceSpec]:
    """The ``worker_processes - 1`` children as critical services (``worker_process:k``) of the service table.

    A child restarting leaves this process's API and workers serving: ``/readyz`` lists it and stays 200.

    :param stop: set when the children are to drain (the supervisor's intake phase): each is sent SIGTERM.
    :param force: the primary's second signal, passed on.
    """
    return [
        ServiceSpec(
            f"worker_process:{index}", partial(run, settings, index, stop, force), critical=True, gates_readiness=False
        )
        for index in range(1, settings.worker_process_count())
    ]


async def run(settings: Settings, index: int, stop: anyio.Event, force: anyio.Event) -> None:
    """Run worker process ``index`` until the primary stops: start it, pass the stop signals on, wait for it.

    :param settings: the primary's settings (the child's are derived by :func:`child_settings`).
    :param index: 1 to ``worker_processes - 1``; names the service and picks the child's ports.
    :param stop: set when the primary begins its stop: the child is sent SIGTERM.
    :param force: set on the primary's second signal: the child is sent SIGTERM again.
    :raises WorkerProcessExitedError: the child ended before ``stop`` was set.

    A child still running ``shutdown_grace_seconds`` + :data:`STOP_MARGIN_SECONDS` after ``stop`` is
    SIGKILLed; cancelled, this SIGKILLs and reaps the child at once.
    """
    if stop.is_set():  # stopping while the crash policy's backoff ran: nothing to start again
        return
    command = [sys.executable, "-m", "taskmesh.runtime.worker_child"]
    # The child's stdin brings its settings, one line, then nothing: its end of file
    # tells the child this process has ended, even by SIGKILL. A session of its own: a terminal's
    # Ctrl-C reaches this process alone, which passes one stop on; the child would otherwise hear
    # two (the terminal's and ours), and two end the grace at once.
    proc = await anyio.open_process(
        command,
        env=child_environment(),
        stdin=subprocess.PIPE,
        stdout=None,
        stderr=None,
        start_new_session=True,
    )
    log.info("worker_process_started", index=index, pid=proc.pid)
    bound = settings.shutdown_grace_seconds + STOP_MARGIN_SECONDS
    try:
        if proc.stdin is not None:  # always: it was asked for
            with contextlib.suppress(anyio.BrokenResourceError):  # it died at once: its exit status says why
                await proc.stdin.send(orjson.dumps(child_settings(settings, index)) + b"\n")
        async with anyio.create_task_group() as group:
            group.start_soon(_pass_signals_on, proc, index, stop, force, bound)
            returncode = await proc.wait()
            group.cancel_scope.cancel()
    finally:
        if proc.returncode is None:  # cancelled: the primary is past waiting
            with anyio.CancelScope(shield=True):
                _signal(proc, signal.SIGKILL)
                await proc.wait()
    exit_status = describe_exit(returncode)
    if not stop.is_set():
        log.warning("worker_process_exited", index=index, pid=proc.pid, exit=exit_status)
        raise WorkerProcessExitedError(index, proc.pid, exit_status)
    log.info("worker_process_stopped", index=index, pid=proc.pid, exit=exit_status)


async def _pass_signals_on(proc: Process, index: int, stop: anyio.Event, force: anyio.Event, bound: float) -> None:
    """SIGTERM on ``stop``, again on ``force``; SIGKILL ``bound`` seconds after ``stop``."""
    await stop.wait()
    _signal(proc, signal.SIGTERM)
    with anyio.move_on_after(bound):
        await force.wait()
        _signal(proc, signal.SIGTERM)
        await anyio.sleep_forever()
    log.error("worker_process_killed", index=index, pid=proc.pid, after_s=bound)
    _signal(proc, signal.SIGKILL)


def _signal(proc: Process, sig: signal.Signals) -> None:
    if proc.returncode is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:  # it ended before we looked
            pass
