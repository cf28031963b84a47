"""Start-up ends with exit 2 and a message naming the setting when a store refuses for good (issue 14).

A refused password, a failed TLS handshake, a database number the server refuses, a Redis
Cluster node behind the standalone client: none of them is an outage that waiting fixes, so
``python -m taskmesh run`` must not retry them for ever. Each case runs a real instance
process against a real server made for it (a Redis of its own with a password or with
``cluster-enabled yes``, or the machine's Redis spoken to wrongly) and checks the exit code
and the last line it prints. While PostgreSQL does not answer, ``/readyz`` names it alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.proc import free_port

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
PREFIX = "taskmesh: error: redis_url: "
AUTH = "; set the ones the server expects"
OPENSSL_SELF_SIGNED = [
    "openssl",
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-days",
    "1",
    "-subj",
    "/CN=127.0.0.1",
]


@pytest.fixture
def cluster_node(tmp_path: Path) -> Iterator[str]:
    """``host:port`` of a Redis started with ``--cluster-enabled yes`` (one node, no slots: it still says so)."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not on PATH")
    port = free_port()
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf"), "--dir", str(tmp_path)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[str]:
    """``host:port`` of a Redis that speaks TLS only, with a self-signed certificate no client trusts."""
    server = shutil.which("redis-server")
    if server is None or shutil.which("openssl") is None:
        pytest.skip("redis-server or openssl is not on PATH")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [*OPENSSL_SELF_SIGNED, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    port = free_port()
    args = [server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-auth-clients", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "redis-server (TLS) did not start"
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run_instance(database_url: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_")}
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        TASKMESH_REDIS_PREFIX=f"refusals-{free_port()}",
        HTTP_PORT="0",
        TASKMESH_LOG_LEVEL="warning",
    )
    return subprocess.run(
        [sys.executable, "-m", "taskmesh", "run"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def redis_address(redis_url: str) -> str:
    return redis_url.split("://", 1)[1].split("/", 1)[0]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no password", "Redis refused the user or password (Authentication required.)" + AUTH),
        (
            "wrong password",
            "Redis refused the user or password (invalid username-password pair or user is disabled.)" + AUTH,
        ),
        (
            "tls to a plain port",
            "the URL asks for TLS (rediss://) but the server on that port speaks plain Redis: use redis:// or "
            "the server's TLS port",
        ),
        ("untrusted certificate", "the TLS handshake with Redis failed ("),
        (
            "database out of range",
            "Redis refused the database number (DB index is out of range); pick one below its `databases` setting",
        ),
        (
            "cluster node",
            "the server is a Redis Cluster node (cluster_enabled:1); taskmesh's client is a standalone one here "
            "and would meet MOVED for the keys other nodes own",
        ),
    ],
)
async def test_a_store_that_refuses_for_good_ends_start_up_with_exit_2_naming_redis_url(
    case: str,
    expected: str,
    database_url: str,
    redis_url: str,
    redis_with_password: str,
    request: pytest.FixtureRequest,
) -> None:
    wrong = "wr0ng-Pa55"
    urls = {
        "no password": f"redis://{redis_with_password}/0",
        "wrong password": f"redis://:{wrong}@{redis_with_password}/0",
        "tls to a plain port": f"rediss://{redis_address(redis_url)}/0?ssl_cert_reqs=none",
        "database out of range": f"redis://{redis_address(redis_url)}/99",
        "cluster node": "",
        "untrusted certificate": "",
    }
    url = urls[case]
    if case == "cluster node":
        url = f"redis://{request.getfixturevalue('cluster_node')}/0"
    elif case == "untrusted certificate":
        url = f"rediss://{request.getfixturevalue('tls_redis')}/0"
    started = time.monotonic()
    done = await anyio.to_thread.run_sync(lambda: run_instance(database_url, url))
    took = time.monotonic() - started
    last = done.stderr.splitlines()[-1] if done.stderr else ""
    assert done.returncode == 2, done.stderr[-3000:]
    assert last.startswith(PREFIX + expected), last
    assert wrong not in done.stderr and wrong not in done.stdout
    assert took < 30, f"start-up took {took:.1f} s to give up"
