"""systemd service notifications (sd_notify(3)): ``READY=1``, ``STOPPING=1``, ``STATUS=`` and the watchdog.

Under a unit with ``Type=notify`` systemd puts ``NOTIFY_SOCKET`` (a path, or
``@name`` in the abstract namespace) into the environment and waits for
``READY=1`` before it counts the service as started; with ``WatchdogSec=`` it
also sets ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``, the process the watchdog
is for) and restarts the service when no ``WATCHDOG=1`` came within that
time. Each notification is one datagram of ``KEY=value`` lines sent to that
socket, as sd_notify(3) describes: a few lines of our own, no library.

Every function here is a no-op when ``NOTIFY_SOCKET`` is unset (a terminal,
Supervisor, a container), so the supervisor calls them unconditionally. A
datagram that cannot be sent (the socket went away, its queue is full) is
dropped and logged once: a notification never stops an instance.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import anyio

from taskmesh.observability.logs import get_logger

log = get_logger("taskmesh.runtime.notify")

_Key = tuple[str | None, str | None, str | None]


class _Notifier:
    """A datagram socket that sends sd_notify(3) assignments to ``address``.

    :param address: ``NOTIFY_SOCKET``: a filesystem path, or ``@name`` for ``name`` in the
        abstract namespace (the ``@`` stands for the leading NUL byte of the socket address).
    :param watchdog_usec: ``WATCHDOG_USEC`` when the watchdog is on for this process, else ``None``.
    """

    def __init__(self, address: str, watchdog_usec: int | None) -> None:
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_usec = watchdog_usec
        self.failed = False
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.socket.setblocking(False)  # a full queue drops the datagram instead of stalling the event loop

    def send(self, *assignments: str) -> None:
        """Send ``KEY=value`` assignments in one datagram, as sd_notify(3) allows (never raises)."""
        try:
            self.socket.sendto("".join(f"{a}\n" for a in assignments).encode(), self.address)
        except OSError as exc:
            if not self.failed:  # once: a service manager that went away is not news every 15 s
                self.failed = True
                log.warning("sd_notify_failed", socket=os.environ.get("NOTIFY_SOCKET"), error=str(exc))


def _watchdog_usec(usec: str | None, pid: str | None) -> int | None:
    """``WATCHDOG_USEC`` when it is a positive integer meant for this process (``WATCHDOG_PID``, if set)."""
    if not usec or not usec.isdigit() or int(usec) <= 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec)


_cached: tuple[_Key, _Notifier | None] | None = None


def _notifier() -> _Notifier | None:
    """The notifier for the current environment, ``None`` when ``NOTIFY_SOCKET`` is unset."""
    global _cached
    key = (os.environ.get("NOTIFY_SOCKET"), os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID"))
    if _cached is not None and _cached[0] == key:
        return _cached[1]
    if _cached is not None and _cached[1] is not None:
        _cached[1].socket.close()
    notifier = _Notifier(key[0], _watchdog_usec(key[1], key[2])) if key[0] else None
    _cached = (key, notifier)
    return notifier


def ready(status: str | None = None) -> None:
    """``READY=1`` (with a ``STATUS=`` line): the instance serves and its services run."""
    if n := _notifier():
        n.send("READY=1", *([f"STATUS={status}"] if status else []))


def stopping(status: str | None = None) -> None:
    """``STOPPING=1`` (with a ``STATUS=`` line): the graceful shutdown has begun."""
    if n := _notifier():
        n.send("STOPPING=1", *([f"STATUS={status}"] if status else []))


def status(text: str) -> None:
    """``STATUS=text``: one line that ``systemctl status`` shows."""
    if n := _notifier():
        n.send(f"STATUS={text}")


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``); ``None`` when the watchdog is off."""
    n = _notifier()
    usec = n.watchdog_usec if n else None
    return usec / 2_000_000 if usec else None


async def watchdog(healthy: Callable[[], bool]) -> None:
    """Send ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while ``healthy()``; return at once when off.

    Runs for the life of the instance. ``healthy`` is liveness, not readiness:
    an instance waiting out a PostgreSQL or Redis outage is alive (a restart
    would not bring the store back), one whose event loop is stuck is not, and
    then no ping is sent because this loop does not run either.
    """
    interval = watchdog_interval()
    n = _notifier()
    if interval is None or n is None:
        return
    while True:
        if healthy():
            n.send("WATCHDOG=1")
        await anyio.sleep(interval)
