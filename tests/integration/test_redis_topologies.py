"""Nothing is lost when a Redis Cluster node is flushed or restarted, or a Sentinel-watched master dies.

Each test runs a real instance against real servers started here on loopback: three
cluster masters (``redis-cli --cluster create``), or a master, a replica and three Sentinels.
Tasks wait in ready and delayed sets on every node while one node loses its memory
(``FLUSHALL`` on it, or ``kill -9`` and a start with nothing saved), or while the master is
killed and the Sentinels promote the replica; every task must then run, and run once. In the
cluster tests the reconciler's sweep is an hour apart, so what repairs the lost queue is its
per-queue marker check, not the sweep.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import asyncpg
import pytest

from taskmesh.store.keys import Keys
from taskmesh.store.redis_clients import open_client
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for
from tests.redis_topologies import Cluster, SentinelSet, started
from tests.tools import require_tool

pytestmark = pytest.mark.anyio
PER_QUEUE = 6
"""Tasks per queue: a blocker holding the queue's one executor, then ready and delayed ones."""


def servers_or_skip() -> None:
    for tool, package in (("redis-server", "redis-server"), ("redis-cli", "redis-tools")):
        require_tool(tool, f"Debian package {package}", "no Redis Cluster or Sentinel was started")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    servers_or_skip()
    with started(Cluster()) as topology:
        yield topology


@pytest.fixture(scope="module")
def patient_cluster() -> Iterator[Cluster]:
    """A cluster whose nodes wait 8 s before they call a silent node failed (Redis's default is 15 s)."""
    servers_or_skip()
    with started(Cluster(node_timeout_ms=8000)) as topology:
        yield topology


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSet]:
    servers_or_skip()
    with started(SentinelSet()) as topology:
        yield topology


def queues_on_every_node(cluster: Cluster, prefix: str) -> list[str]:
    """One queue name per cluster node, each owned by a different node."""
    chosen: dict[int, str] = {}
    for i in range(200):
        queue = f"q{i}"
        chosen.setdefault(cluster.node_of(Keys(prefix).ready(queue)).port, queue)
        if len(chosen) == len(cluster.nodes):
            return sorted(chosen.values())
    raise AssertionError("no queue names cover every node")


def recording(registry: Registry, gate: anyio.Event, runs: list[str]) -> None:
    @registry.task("recorded")
    async def recorded(payload: dict[str, Any]) -> None:
        if payload.get("block"):
            await gate.wait()
        runs.append(payload["n"])


async def create_tasks(client: Any, queues: list[str], start: int = 0) -> list[str]:
    """Per queue, a blocker, then two ready tasks and three delayed (1.5 to 2.5 s); returns the ns."""
    made: list[str] = []
    for queue in queues:
        for i in range(PER_QUEUE):
            n = f"{queue}-{start + i}"
            body: dict[str, Any] = {"name": "recorded", "queue_name": queue, "payload": {"n": n, "block": i == 0}}
            if i >= 3:
                body["delay_seconds"] = 1.5 + (i - 3) * 0.5
            r = await client.post("/api/v1/tasks", json=body)
            assert r.status_code == 201, r.text
            made.append(n)
    return made


async def run_once_each(pool: asyncpg.Pool, runs: list[str], made: list[str]) -> None:
    await wait_for(lambda: pool.fetchval("SELECT count(*) = $1 FROM tasks WHERE status = 'completed'", len(made)), 30)
    assert Counter(runs) == Counter(made), "a task was lost or ran twice"


@pytest.mark.parametrize("loss", ["flush", "restart"])
async def test_a_cluster_node_that_loses_its_memory_loses_no_task(
    loss: str, cluster: Cluster, start_instance: Any, registry: Registry, pool: asyncpg.Pool, prefix: str
) -> None:
    gate, runs = anyio.Event(), list[str]()
    recording(registry, gate, runs)
    queues = queues_on_every_node(cluster, prefix)
    keys = Keys(prefix)
    settings = {"redis_url": cluster.url, "redis_mode": "cluster", "queue_names": queues}
    async with start_instance(**settings, reconcile_interval_seconds=3600) as inst, http(inst) as client:
        made = await create_tasks(client, queues)
        await wait_for(lambda: pool.fetchval("SELECT count(*) = $1 FROM tasks WHERE status = 'running'", len(queues)))
        victim_queue = queues[0]
        victim = cluster.node_of(keys.ready(victim_queue))
        with victim.client() as node:
            assert node.zcard(keys.ready(victim_queue)) == 2 and node.zcard(keys.delayed(victim_queue)) == 3
        if loss == "flush":
            with victim.client() as node:
                node.flushall()
        else:
            await anyio.to_thread.run_sync(lambda: cluster.restart(victim))
        # Before the delayed ones are due, the check found the queue's marker gone and pushed it all again.
        redis = open_client(cluster.url, "cluster", decode=True)
        try:
            await wait_for(lambda: _all_back(redis, keys, victim_queue), timeout=10, interval=0.05)
        finally:
            await redis.aclose()
        gate.set()
        await run_once_each(pool, runs, made)
        assert (await client.get("/readyz")).status_code == 200


async def test_a_cluster_node_down_crashes_no_service_and_the_other_nodes_queues_keep_running(
    patient_cluster: Cluster, start_instance: Any, registry: Registry, pool: asyncpg.Pool, prefix: str
) -> None:
    """Until the cluster calls the node failed, the other nodes' queues run; then the whole cluster
    refuses (CLUSTERDOWN, no replicas here): an outage of every service, never a crash. redis-py's
    cluster client closes its connections to every node on such errors, under calls in flight."""
    cluster = patient_cluster
    gate, runs = anyio.Event(), list[str]()
    gate.set()
    recording(registry, gate, runs)
    queues = queues_on_every_node(cluster, prefix)
    settings = {"redis_url": cluster.url, "redis_mode": "cluster", "queue_names": queues}
    async with start_instance(**settings) as inst, http(inst) as client:
        made = await create_tasks(client, queues)
        await wait_for(lambda: pool.fetchval("SELECT count(*) = $1 FROM tasks WHERE status = 'completed'", 3 * 3))
        victim = cluster.node_of(Keys(prefix).ready(queues[-1]))
        victim.stop(kill=True)
        healthy = await create_tasks(client, queues[:1], start=len(made))
        made += healthy
        ran = await wait_for(lambda: _ran(pool, healthy[:3]), timeout=5)  # the ready ones, while the node is down
        assert ran, "a queue on a healthy node stopped while another node was down"
        for _ in range(6):  # creates while the cluster is down: PostgreSQL has them, Redis gets them later
            made += await create_tasks(client, queues[:1], start=len(made))
            await anyio.sleep(1)
        await anyio.to_thread.run_sync(lambda: cluster.restart(victim))
        await run_once_each(pool, runs, made)
        ready = await wait_for(lambda: _ready(client), timeout=15)
        assert "services" not in ready, ready  # no service failed or is restarting
        metrics = (await client.get("/metrics")).text
        crashed = [line for line in metrics.splitlines() if line.startswith("taskmesh_service_restarts_total{")]
        assert all(line.endswith(" 0.0") for line in crashed), crashed


async def _ran(pool: asyncpg.Pool, ns: list[str]) -> bool:
    done = await pool.fetchval(
        "SELECT count(*) FROM tasks WHERE status = 'completed' AND payload->>'n' = ANY($1::text[])", ns
    )
    return bool(done == len(ns))


async def _ready(client: Any) -> dict[str, Any] | None:
    r = await client.get("/readyz")
    return dict(r.json()) if r.status_code == 200 else None


async def _all_back(redis: Any, keys: Keys, queue: str) -> bool:
    try:
        marker = await redis.exists(keys.marker(queue))
        return bool(marker) and await redis.zcard(keys.ready(queue)) + await redis.zcard(keys.delayed(queue)) == 5
    except Exception:  # the restarted node is still rejoining: look again
        return False


async def test_a_sentinel_failover_after_the_master_is_killed_loses_no_task(
    sentinels: SentinelSet, start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    gate, runs = anyio.Event(), list[str]()
    recording(registry, gate, runs)
    queues = ["default", "emails"]
    async with start_instance(redis_url=sentinels.url, queue_names=queues) as inst, http(inst) as client:
        made = await create_tasks(client, queues)
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 2 FROM tasks WHERE status = 'running'"))
        old = sentinels.master_port()
        new = await anyio.to_thread.run_sync(sentinels.kill_master)
        assert new != old
        # Tasks created after the failover go to the new master; the instance found it through the Sentinels.
        made += await create_tasks(client, queues, start=PER_QUEUE)
        gate.set()
        await run_once_each(pool, runs, made)
        assert (await client.get("/readyz")).status_code == 200
