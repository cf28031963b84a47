"""Redis topologies started by the tests on loopback: a 3-master Redis Cluster, and Sentinel.

Each node is a real ``redis-server`` (no persistence) in a temporary directory of its own, so a
test can restart it, kill it or flush it. Nothing here is a stand-in: taskmesh's client meets
the same ``MOVED``, failovers and topology refreshes it would meet in production.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import redis as sync_redis
from redis.crc import key_slot

from tests.proc import free_port

SENTINEL_MASTER = "tm-master"
"""The master name the sentinels of :class:`SentinelSet` watch."""


def _server() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("redis-server is not on PATH")
    return found


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not start") from None
            time.sleep(0.05)


class Node:
    """One ``redis-server`` on a fixed loopback port whose files stay in ``root``.

    :param args: extra ``redis-server`` options, kept across restarts.
    """

    def __init__(self, root: Path, args: tuple[str, ...] = (), *, conf: Path | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.args = args
        self.conf = conf
        self.proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        """Start it (or again, after :meth:`stop`); returns once the port accepts connections."""
        # A config file must come first on redis-server's command line.
        command = [
            _server(),
            *([str(self.conf)] if self.conf else []),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.root),
        ]
        command += ["--save", "", "--appendonly", "no", *self.args]
        # The server writes to its own copy of the descriptor: ours is closed once it started.
        with (self.root / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _wait_port(self.port, self.proc)

    def stop(self, *, kill: bool = False) -> None:
        """Stop it (``SIGKILL`` with ``kill``); its memory is lost: nothing is persisted."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(timeout=10)

    def client(self) -> sync_redis.Redis:
        """A standalone client of this node alone."""
        return sync_redis.Redis(port=self.port, socket_timeout=5)


class Cluster:
    """Three masters sharing the 16,384 slots (``redis-cli --cluster create``), no replicas."""

    def __init__(self, root: Path | None = None, node_timeout_ms: int = 2000) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="tm-cluster-"))
        self.nodes: list[Node] = []
        for i in range(3):
            bus = free_port()
            files = ("--cluster-config-file", str(self.root / f"n{i}" / "nodes.conf"))
            args = (
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                str(bus),
                *files,
                "--cluster-node-timeout",
                str(node_timeout_ms),
            )
            self.nodes.append(Node(self.root / f"n{i}", args))

    @property
    def url(self) -> str:
        """A URL naming one node; a cluster client learns the others from it."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> None:
        """Start the nodes, join them and wait for ``cluster_state:ok`` on each."""
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not on PATH")
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every node says ``cluster_state:ok`` and knows all three masters."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if all(self._ok(n) for n in self.nodes):
                    return
            except sync_redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.1)

    @staticmethod
    def _ok(node: Node) -> bool:
        with node.client() as c:
            info = c.cluster("INFO")
            return bool(info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == 3)

    def node_of(self, key: str) -> Node:
        """The node that owns ``key``'s slot."""
        slot = key_slot(key.encode())
        with self.nodes[0].client() as c:
            for start, end, master, *_replicas in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return next(n for n in self.nodes if n.port == int(master[1]))
        raise LookupError(f"no node owns slot {slot}")

    def restart(self, node: Node) -> None:
        """Restart ``node`` empty (no persistence) under its old identity, and wait for the cluster."""
        node.stop(kill=True)
        node.start()
        self.wait_ok()

    def stop(self) -> None:
        """Stop every node and remove the files."""
        for node in self.nodes:
            node.stop(kill=True)
        shutil.rmtree(self.root, ignore_errors=True)


class SentinelSet:
    """A master, one replica and three sentinels watching them (quorum 2)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="tm-sentinel-"))
        self.master = Node(self.root / "master")
        self.replica = Node(self.root / "replica", ("--replicaof", "127.0.0.1", str(self.master.port)))
        self.sentinels: list[Node] = []
        for i in range(3):
            root = self.root / f"s{i}"
            root.mkdir(parents=True, exist_ok=True)
            conf = root / "sentinel.conf"
            conf.write_text(
                f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n"
                f"sentinel failover-timeout {SENTINEL_MASTER} 5000\n"
                f"sentinel parallel-syncs {SENTINEL_MASTER} 1\n"
            )
            self.sentinels.append(Node(root, ("--sentinel",), conf=conf))

    @property
    def url(self) -> str:
        """``redis+sentinel://`` naming the three sentinels and the master name."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SENTINEL_MASTER}/0"

    def start(self) -> None:
        """Start the master, the replica (synced) and the sentinels (each seeing the replica)."""
        self.master.start()
        self.replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        deadline = time.monotonic() + 30
        while not self._settled():
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not see the master and its replica")
            time.sleep(0.1)

    def _settled(self) -> bool:
        try:
            with self.replica.client() as r:
                if r.info("replication").get("master_link_status") != "up":
                    return False
            for sentinel in self.sentinels:
                with sentinel.client() as s:
                    state = s.sentinel_master(SENTINEL_MASTER)
                    if int(state.get("num-slaves", 0)) < 1 or int(state.get("num-other-sentinels", 0)) < 2:
                        return False
            return True
        except sync_redis.RedisError:
            return False

    def master_port(self) -> int:
        """The port of the node the sentinels call master now."""
        with self.sentinels[0].client() as s:
            _host, port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER)
            return int(port)

    def kill_master(self, timeout: float = 30.0) -> int:
        """``kill -9`` the master and wait until the Sentinels promote the replica; returns its port.

        The way a master is lost in production (a crashed host), not ``SENTINEL FAILOVER``, which
        leaves the old master taking writes for seconds until the Sentinels demote it.
        """
        old = self.master_port()
        dead = self.master if old == self.master.port else self.replica
        dead.stop(kill=True)
        deadline = time.monotonic() + timeout
        while True:
            port = self.master_port()
            if port != old:
                node = self.master if port == self.master.port else self.replica
                with node.client() as c:
                    if c.info("replication").get("role") == "master":
                        return port
            if time.monotonic() > deadline:
                raise RuntimeError("the Sentinels did not promote the replica")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every server and remove the files."""
        for node in [*self.sentinels, self.replica, self.master]:
            node.stop(kill=True)
        shutil.rmtree(self.root, ignore_errors=True)


Topology = TypeVar("Topology", bound=Cluster | SentinelSet)


@contextlib.contextmanager
def started(topology: Topology) -> Iterator[Topology]:
    """Start ``topology`` for the block; stop it and remove its files after, whatever happened."""
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()
