"""Start-up ends with exit 2 and a message naming the setting when a store refuses for good.

A refused password, a failed TLS handshake, a database number the server refuses, a Redis
Cluster node behind the standalone client: none of them is an outage that waiting fixes, so
``python -m taskmesh run`` must not retry them for ever. Each case runs a real instance
process against a real server made for it (a Redis of its own with a password or with
``cluster-enabled yes``, or the machine's Redis spoken to wrongly) and checks the exit code
and the last line it prints. While PostgreSQL does not answer, ``/readyz`` names it alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis as sync_redis
from redis.crc import key_slot

import taskmesh
from taskmesh.errors import ConfigError, StoreError
from taskmesh.store import Keys, RedisStore
from taskmesh.store.redis_urls import NOT_A_CLUSTER, cluster_refusal
from tests.conftest import POOLER, redis_server
from tests.proc import free_port
from tests.redis_topologies import Node
from tests.tools import require_tool

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
PREFIX = "taskmesh: error: redis_url: "
HALF = 8192
"""Slots 0..8191 on the first node of the two-node cluster, the rest on the second."""
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
    with redis_server(*cluster_args(tmp_path)) as port:
        yield f"127.0.0.1:{port}"


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[str]:
    """``host:port`` of a Redis that speaks TLS only, with a self-signed certificate no client trusts."""
    require_tool("openssl", "Debian package openssl", "no TLS-only Redis was started")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([*OPENSSL_SELF_SIGNED, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    args = ("--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-auth-clients", "no")
    with redis_server(*args, tls=True) as port:
        yield f"127.0.0.1:{port}"


def cluster_args(root: Path, bus: int = 0) -> tuple[str, ...]:
    """``redis-server`` options of a cluster node whose files stay in ``root``.

    The cluster bus gets a free port of its own: by default it is the node's port plus 10,000,
    which for a high free port is past 65,535 or taken (``bus``: that port, 0 picks one).
    """
    root.mkdir(parents=True, exist_ok=True)
    files = ("--cluster-config-file", str(root / "nodes.conf"), "--dir", str(root))
    return ("--cluster-enabled", "yes", "--cluster-port", str(bus or free_port()), *files)


@pytest.fixture
def lone_sentinel(tmp_path: Path) -> Iterator[str]:
    """``host:port`` of a Sentinel that watches no master."""
    conf = tmp_path / "sentinel.conf"
    conf.write_text("")
    sentinel = Node(tmp_path, ("--sentinel",), conf=conf)
    sentinel.start()
    try:
        yield f"127.0.0.1:{sentinel.port}"
    finally:
        sentinel.stop()


def run_instance(database_url: str, redis_url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_")}
    env.update(extra)
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
            'the server is a Redis Cluster node (cluster_enabled:1); with redis_mode = "standalone" taskmesh\'s '
            'client would meet MOVED for the keys other nodes own: set redis_mode = "cluster"',
        ),
        (
            "not a cluster",
            'redis_mode is "cluster" but the server is not a Redis Cluster node (cluster_enabled:0): '
            'set redis_mode = "standalone", or name a cluster node',
        ),
        ("unknown master", "the Sentinels know no master named 'tm-nowhere' (they watch: none)"),
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
        "not a cluster": f"redis://{redis_address(redis_url)}/0",
        "unknown master": "",
    }
    url = urls[case]
    if case == "cluster node":
        url = f"redis://{request.getfixturevalue('cluster_node')}/0"
    elif case == "untrusted certificate":
        url = f"rediss://{request.getfixturevalue('tls_redis')}/0"
    elif case == "unknown master":
        url = f"redis+sentinel://{request.getfixturevalue('lone_sentinel')}/tm-nowhere/0"
    mode = {"TASKMESH_REDIS_MODE": "cluster"} if case == "not a cluster" else {}
    started = time.monotonic()
    done = await anyio.to_thread.run_sync(lambda: run_instance(database_url, url, **mode))
    took = time.monotonic() - started
    last = done.stderr.splitlines()[-1] if done.stderr else ""
    assert done.returncode == 2, done.stderr[-3000:]
    assert last.startswith(PREFIX + expected), last
    assert wrong not in done.stderr and wrong not in done.stdout
    assert took < 30, f"start-up took {took:.1f} s to give up"


@pytest.fixture
def two_node_cluster(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """Ports of two cluster nodes that share the 16,384 slots half and half (``cluster_state:ok``)."""
    bus_b = free_port()
    with (
        redis_server(*cluster_args(tmp_path / "a")) as a,
        redis_server(*cluster_args(tmp_path / "b", bus_b)) as b,
    ):
        client_a, client_b = sync_redis.Redis(port=a), sync_redis.Redis(port=b)
        try:
            client_a.cluster("ADDSLOTSRANGE", 0, HALF - 1)
            client_b.cluster("ADDSLOTSRANGE", HALF, 16383)
            client_a.cluster("MEET", "127.0.0.1", b, bus_b)
            deadline = time.monotonic() + 20
            while not all(c.cluster("INFO")["cluster_state"] == "ok" for c in (client_a, client_b)):
                assert time.monotonic() < deadline, "the two nodes did not form a cluster"
                time.sleep(0.1)
            yield a, b
        finally:
            client_a.close()
            client_b.close()


async def test_the_readiness_probe_of_a_standalone_client_on_a_cluster_node_fails_for_good_with_moved(
    two_node_cluster: tuple[int, int],
) -> None:
    """``/readyz``'s Redis check touches the queues' keys: a node that owns another's slots answers MOVED."""
    here = next(q for q in ("a", "b", "c", "d") if key_slot(q.encode()) < HALF)
    elsewhere = next(q for q in ("a", "b", "c", "d") if key_slot(q.encode()) >= HALF)
    store = RedisStore.connect(f"redis://127.0.0.1:{two_node_cluster[0]}/0", Keys("probe"))
    try:
        await store.probe([here])  # its slot is this node's: the check passes
        with pytest.raises(StoreError) as caught:
            await store.probe([here, elsewhere])
    finally:
        await store.close()
    assert not caught.value.transient
    assert str(caught.value).startswith("redis error in probe: MovedError: ")


async def test_a_python_client_on_the_wrong_kind_of_redis_fails_at_open_naming_redis_url(
    two_node_cluster: tuple[int, int], database_url: str, redis_url: str
) -> None:
    """A standalone client on a cluster node (or the reverse) would lose every push to MOVED: it fails at once."""
    node = f"redis://127.0.0.1:{two_node_cluster[0]}/0"
    with pytest.raises(StoreError) as standalone:
        async with taskmesh.Client(database_url, node, pg_pooler=POOLER):
            pass
    assert not standalone.value.transient
    assert str(standalone.value) == "redis error in connect: " + cluster_refusal("cluster_enabled:1")
    standalone_server = f"redis://{redis_address(redis_url)}/0"  # the tests' Redis may be on another database
    with pytest.raises(StoreError) as cluster:
        async with taskmesh.Client(database_url, standalone_server, pg_pooler=POOLER, redis_mode="cluster"):
            pass
    assert str(cluster.value) == "redis error in connect: " + NOT_A_CLUSTER
    with pytest.raises(ConfigError, match=r"^redis_mode: a Redis Cluster has database 0 alone"):
        taskmesh.Client(database_url, f"redis://{redis_address(redis_url)}/3", pg_pooler=POOLER, redis_mode="cluster")
    async with taskmesh.Client(database_url, node, pg_pooler=POOLER, redis_mode="cluster") as client:
        assert await client.enqueue("n") is not None
