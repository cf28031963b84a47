"""The dev profile's stores keep their URLs across restarts of one ``TASKMESH_DEV_DIR``, and say them.

The embedded PostgreSQL listens on a Unix socket in its data directory (its URL
follows the directory); the embedded Valkey takes the port it had last time in
that directory when it is free, else another one, saved for next time and logged.
``dev_stores`` logs both URLs, so a client or the CLI can be pointed at them.
"""

from __future__ import annotations

import gc
import os
import socket
from pathlib import Path

import valkey
from structlog.testing import capture_logs

from taskmesh.dev.stack import EmbeddedValkey, embedded_stores
from taskmesh.observability.logs import configure


def test_a_dev_dir_keeps_its_valkey_port_across_restarts_and_moves_off_a_taken_one(tmp_path: Path) -> None:
    first = EmbeddedValkey(tmp_path, persist=False)
    port = first.port
    first.stop()
    second = EmbeddedValkey(tmp_path, persist=False)
    assert second.port == port
    second.stop()
    with socket.socket() as squatter, capture_logs() as logs:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may linger in TIME_WAIT
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        third = EmbeddedValkey(tmp_path, persist=False)
        third.stop()
    assert third.port != port
    assert [e for e in logs if e["event"] == "embedded_valkey_port_changed"] == [
        {"event": "embedded_valkey_port_changed", "log_level": "warning", "was": port, "port": third.port}
    ]
    fourth = EmbeddedValkey(tmp_path, persist=False)
    fourth.stop()
    assert fourth.port == third.port


def test_dev_logs_the_urls_of_the_stores_it_started(tmp_path: Path) -> None:
    configure("info", "console")  # the line is at info; the test session logs warnings only
    try:
        with capture_logs() as logs, embedded_stores(None, None, root=tmp_path) as (database_url, redis_url):
            pass
    finally:
        configure(os.environ.get("TASKMESH_TEST_LOG_LEVEL", "warning"), "console")
    [said] = [e for e in logs if e["event"] == "dev_stores"]
    assert (said["database_url"], said["redis_url"]) == (database_url, redis_url)
    assert database_url.startswith("postgresql://") and redis_url.startswith("redis://127.0.0.1:")
    with embedded_stores(None, None, root=tmp_path) as again:
        assert again == (database_url, redis_url)


def test_a_stopped_valkey_collected_after_its_successor_started_leaves_the_successor_running(tmp_path: Path) -> None:
    """The CI flake of the test above: the first server object's finalizer read the shared pidfile."""
    first = EmbeddedValkey(tmp_path, persist=False)
    first.stop()
    second = EmbeddedValkey(tmp_path, persist=False)
    try:
        del first
        gc.collect()
        assert valkey.Valkey(port=second.port, socket_connect_timeout=1).ping()
    finally:
        second.stop()
    assert second.exit_reason() is not None  # stopped: the first did not take its pidfile away either


def test_starting_a_running_embedded_valkey_again_keeps_the_server_it_runs(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path, persist=False)
    try:
        pid = server.process.pid
        server.start()
        assert server.process.pid == pid and server.exit_reason() is None
        assert valkey.Valkey(port=server.port, socket_connect_timeout=1).ping()
    finally:
        server.stop()
    assert not Path(f"/proc/{pid}").exists() or "valkey" not in Path(f"/proc/{pid}/cmdline").read_text()
