"""``python -m benchmarks.bench``: how much work one instance pushes through, and how soon a task starts.

Run it from the repository root with the venv's Python
(``.venv/bin/python -m benchmarks.bench --tasks 20000``, or
``make bench ARGS="--tasks 20000"``); it is not part of the installed package.

It creates a database ``taskmesh_bench`` (``--database``) on the PostgreSQL of ``DATABASE_URL``
(default ``postgresql://postgres@127.0.0.1:5432/postgres``; the role must be
allowed to create databases) and uses the Redis of ``REDIS_URL`` (default
``redis://127.0.0.1:6379/0``, recorder in db 15), then:

1. **bulk enqueue**: ``--tasks`` no-op tasks through ``Client.enqueue_many``
   (1,000 per call: one statement and one pipeline each), twice, each time into a fresh database;
   the faster run counts (:data:`ENQUEUE_RUNS`);
2. **drain**: starts one instance, or ``--instances`` side by side (``python -m taskmesh`` with the handler
   module ``benchmarks.bench_handler``, found through ``PYTHONPATH``; ``--worker-processes`` each,
   whose children's CPU counts as the instance's;
   ``--concurrency`` executors, durable: ``synchronous_commit`` as the server has it) and times
   it from launch until every task ran (and until the first task's handler
   started: the start-up), with the CPU seconds of the instance,
   of PostgreSQL and of Redis, and the instance's peak RSS; then checks that
   every task ran exactly once (the recorder) and is ``completed`` with one run;
3. **single HTTP creates**: ``--http`` ``POST /api/v1/tasks`` from 8
   connections (tasks/s), then 1,000 at a steady 200 requests/s (latency);
4. **pickup latency**: on a fresh database after a ``CHECKPOINT`` and a fresh instance (as
   the peers' harness prepares PgQueuer's), ``--latency-count`` tasks enqueued one by one at
   ``--rate`` per second, from the enqueue call to the handler's start, after one
   untimed task that opens the client's connections (as the peers' harness does);
5. ``--memory``: RSS of the instance after 10% and after 100% of the drain;
6. ``--pgbouncer HOST:PORT``: the instance and the client reach PostgreSQL through a
   PgBouncer in transaction mode (``pg_pooler = "transaction"``); set-up goes direct;
   ``--redis-cluster HOST:PORT``: they dispatch through the Redis Cluster of which that is a
   node (``redis_mode = "cluster"``); the recorder stays on ``REDIS_URL``;
7. **every core**: ``--spin-tasks`` tasks of a ``def`` handler burning 5 ms of
   pure Python each, drained with 1 and then 2 handler processes
   (``sync_processes``), after a warm-up that starts the processes, timed from
   the first task's start, and the ratio of the two rates;
8. ``--empty-handler``: the bulk enqueue and the drain with tasks of ``bench.empty``, a handler
   that does nothing, instead of the peers' job body (a Redis round trip that costs the
   instance more CPU than taskmesh's own work per task): taskmesh's own cost. Progress, the
   first start and exactly once are read from PostgreSQL (each task completed, with one run),
   on a connection whose backend's CPU is not counted;
9. ``--compare``: the same drain and latency workloads through PgQueuer, arq
   and Celery, with the peers harness of ``shared/bench/peers`` (see
   ``benchmarks/peers.py``), and one table of every figure with its ratio to
   each peer's.

PostgreSQL's CPU is that of the backends of database ``taskmesh_bench`` only
(``benchmarks/measure.py``); Redis's is the host's ``redis-server`` processes that ran through the drain.

Every figure printed is measured in this run; nothing is remembered between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import redis.asyncio as aioredis

import taskmesh
from benchmarks.bench_handler import recorder_keys
from benchmarks.measure import BackendCpu, cpu_by_name, cpu_of_tree, cpu_since, pct, rss_kib, through, with_db
from benchmarks.peers import run_peers
from benchmarks.report import print_report
from taskmesh.clients.client import Client
from taskmesh.store.postgres import migrate_url
from taskmesh.store.redis_clients import open_client
from taskmesh.store.redis_types import RedisMode

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: the instance's ``PYTHONPATH`` starts with it, so it imports ``benchmarks.bench_handler``."""
BENCH_DB = "taskmesh_bench"
"""The default ``--database``, which names the Redis key prefix as well."""
REDIS_NAMES = ("redis-server", "valkey-server")
ENQUEUE_RUNS = 2
"""Timed bulk enqueues, the best of which counts: as many as the peers' harness gives PgQueuer, whose
bulk enqueue is the best of its two configurations' runs (``peers.py``), so both are the best of two."""


class Bench:
    """One benchmark run (see the module docs); ``figures`` collects what is printed."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.admin_url = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
        self.redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        self.database: str = args.database
        self.prefix = self.database
        self.ran, self.start = recorder_keys(self.database)
        self.db_url = with_db(self.admin_url, self.database)
        # The instance and the client go through PgBouncer with --pgbouncer; set-up goes direct.
        self.pooler = "transaction" if args.pgbouncer else "none"
        self.work_url = through(self.db_url, args.pgbouncer) if args.pgbouncer else self.db_url
        # The instance and the client dispatch through a Redis Cluster with --redis-cluster.
        self.redis_mode: RedisMode = "cluster" if args.redis_cluster else "standalone"
        self.work_redis = f"redis://{args.redis_cluster}/0" if args.redis_cluster else self.redis_url
        parts = urlsplit(self.redis_url)
        self.recorder_url = urlunsplit((parts.scheme, parts.netloc, "/15", "", ""))
        self.figures: dict[str, Any] = {}

    async def reset(self) -> None:
        """A fresh ``--database`` (``taskmesh_bench``), none of its prefix's keys, an empty recorder."""
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
            await admin.execute(f"CREATE DATABASE {self.database}")
        finally:
            await admin.close()
        await migrate_url(self.db_url)
        client = open_client(self.work_redis, self.redis_mode)
        try:
            async for key in client.scan_iter(match=f"{self.prefix}:*", count=1000):
                await client.delete(key)  # one key per call: a cluster's keys live in many slots
        finally:
            await client.aclose()
        async with self.recorder() as recorder:
            await recorder.delete(self.ran, self.start)

    def recorder(self) -> aioredis.Redis:
        """A client of the recorder (db 15 of ``REDIS_URL``), for ``async with``."""
        return aioredis.Redis.from_url(self.recorder_url)

    def start_instance(self, concurrency: int, port: int = 0, **extra: str) -> subprocess.Popen[bytes]:
        """Start ``python -m taskmesh`` on the bench database; ``extra``: more environment variables."""
        env = {
            **os.environ,
            "DATABASE_URL": self.work_url,
            "TASKMESH_PG_POOLER": self.pooler,
            "REDIS_URL": self.work_redis,
            "TASKMESH_REDIS_MODE": self.redis_mode,
            "TASKMESH_REDIS_PREFIX": self.prefix,
            # The instance imports the handler from this checkout, whatever its working directory.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "TASKMESH_HANDLERS": "benchmarks.bench_handler",
            "TASKMESH_BENCH_RECORDER_URL": self.recorder_url,
            "TASKMESH_BENCH_RECORDER_KEYS": self.database,
            "WORKER_CONCURRENCY": str(concurrency),
            "TASKMESH_PREFETCH": str(self.args.prefetch),
            "HTTP_PORT": str(port),
            "TASKMESH_LOG_LEVEL": "warning",
            "TASKMESH_MIGRATE_ON_START": "false",
            "TASKMESH_WORKER_PROCESSES": str(getattr(self.args, "worker_processes", 1)),
            **extra,
        }
        return subprocess.Popen([sys.executable, "-m", "taskmesh"], env=env, stdout=subprocess.DEVNULL)

    @staticmethod
    def stop_instance(proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM, then SIGKILL after 40 s."""
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def client(self) -> Client:
        """A :class:`~taskmesh.clients.client.Client` of the bench database and Redis, for ``async with``."""
        return Client(
            self.work_url, self.work_redis, redis_prefix=self.prefix, pg_pooler=self.pooler, redis_mode=self.redis_mode
        )

    async def enqueue_and_drain(self) -> None:
        """Bulk enqueue ``--tasks`` no-ops, drain them with ``--instances`` instances (1), check exactly once.

        The instances' CPU is summed; the RSS figures are the first instance's. With
        ``--empty-handler`` the tasks are ``bench.empty``'s, and progress is read from PostgreSQL.
        """
        n = self.args.tasks
        name = "bench.empty" if self.args.empty_handler else "bench.noop"
        rates = []
        for _ in range(ENQUEUE_RUNS):  # each into a fresh database; the last run's tasks are drained
            await self.reset()
            async with self.client() as client:
                t0 = time.perf_counter()
                for start in range(0, n, 1000):
                    await client.enqueue_many([{"name": name} for _ in range(min(1000, n - start))])
                rates.append(n / (time.perf_counter() - t0))
        self.figures["bulk_enqueue_per_s"] = max(rates)
        self.figures["bulk_enqueue_runs"] = rates
        admin = await asyncpg.connect(self.admin_url)
        watch = await asyncpg.connect(self.db_url) if self.args.empty_handler else None
        # The watching connection's backend is not the instance's: its CPU is left out.
        backends = BackendCpu(admin, self.database, exclude={watch.get_server_pid()} if watch else None)
        progress = _Progress(self.recorder(), (self.ran, self.start), watch)
        try:
            await backends.start()
            await self._drain(n, backends, progress)
        finally:
            await progress.recorder.aclose()
            if watch is not None:
                await watch.close()
            await admin.close()
        await self._check_exactly_once(n)

    async def _drain(self, n: int, backends: BackendCpu, progress: _Progress) -> None:
        rd0 = cpu_by_name(REDIS_NAMES)
        launched = time.time()  # the handler records its start on this clock
        t0 = time.perf_counter()
        procs = [self.start_instance(self.args.concurrency) for _ in range(self.args.instances)]
        first = procs[0]
        rss_at_10pct = 0
        try:
            polled = 0.0
            while (done := await progress.done()) < n:
                if not rss_at_10pct and done >= n // 10:
                    rss_at_10pct = rss_kib(first.pid)
                for proc in procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"an instance exited with {proc.returncode} after {done} of {n} tasks")
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError(f"drain did not finish in 600 s ({done} of {n})")
                if time.perf_counter() - polled > 0.25:
                    await backends.poll()
                    polled = time.perf_counter()
                await asyncio.sleep(progress.interval)
            elapsed = time.perf_counter() - t0
            cpu = sum(cpu_of_tree(proc.pid) for proc in procs)  # with its worker processes
            await backends.poll()
            self.figures.update(
                drain_per_s=n / elapsed,
                drain_seconds=elapsed,
                startup_seconds=await progress.first_start() - launched,
                instance_cpu_us_per_task=cpu / n * 1e6,
                postgres_cpu_us_per_task=backends.total() / n * 1e6,
                redis_cpu_us_per_task=cpu_since(rd0, REDIS_NAMES) / n * 1e6,
                peak_rss_mib=rss_kib(first.pid, "VmHWM") / 1024,
                rss_after_10pct_mib=rss_at_10pct / 1024,
                rss_after_100pct_mib=rss_kib(first.pid) / 1024,
            )
            await asyncio.sleep(1.5)  # late duplicates would show up now
        finally:
            for proc in procs:
                self.stop_instance(proc)

    async def _check_exactly_once(self, n: int) -> None:
        conn = await asyncpg.connect(self.db_url)
        try:
            completed = await conn.fetchval("SELECT count(*) FROM tasks WHERE status = 'completed'")
            runs = await conn.fetchval("SELECT count(*) FROM task_runs")
            if self.args.empty_handler:  # no recorder: a task that ran twice has two runs
                counts = [r[0] for r in await conn.fetch("SELECT count(*) FROM task_runs GROUP BY task_id")]
            else:
                async with self.recorder() as recorder:
                    counts = [int(v) for v in await recorder.hvals(self.ran)]
        finally:
            await conn.close()
        self.figures["exactly_once"] = len(counts) == n and all(c == 1 for c in counts) and completed == n and runs == n
        self.figures["exactly_once_detail"] = (
            f"ran={len(counts)} duplicated={sum(1 for c in counts if c > 1)} completed={completed} runs={runs}"
        )

    async def spin(self) -> None:
        """The every-core figure: ``--spin-tasks`` 5 ms CPU-bound ``def`` tasks with 1, then 2 processes.

        Each instance first runs a few warm-up tasks, so its handler processes have started
        (spawned and imported) before the timed tasks are enqueued; the time runs from the
        first timed task's start until every one has run.
        """
        n = self.args.spin_tasks
        for processes in (1, 2):
            await self.reset()
            proc = self.start_instance(
                max(4, processes * 2), TASKMESH_SYNC_PROCESSES=str(processes), TASKMESH_WORKER_PROCESSES="1"
            )
            try:
                async with self.recorder() as recorder, self.client() as client:
                    for count in (4 * processes, n):  # the warm-up, then the timed tasks
                        await recorder.delete(self.ran, self.start)
                        for start in range(0, count, 1000):
                            batch = [{"name": "bench.spin", "payload": {"ms": 5}}] * min(1000, count - start)
                            await client.enqueue_many(batch)
                        t0 = time.perf_counter()
                        while await recorder.hlen(self.ran) < count:  # polls Redis
                            if proc.poll() is not None or time.perf_counter() - t0 > 600:
                                raise RuntimeError(f"the spin drain with {processes} processes did not finish")
                            await asyncio.sleep(0.01)
                    done = time.time()
                    first = min(float(v) for v in await recorder.hvals(self.start))
                self.figures[f"spin_per_s_{processes}"] = n / (done - first)
            finally:
                self.stop_instance(proc)

    async def http_and_latency(self) -> None:
        """Single HTTP creates (rate, then latency at 200/s), then the pickup latency."""
        import httpx  # the benchmark's HTTP client (a dev dependency)

        await self.reset()
        port = _free_port()
        proc = self.start_instance(self.args.concurrency, port)
        base = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                await wait_ready(http)
                count = self.args.http
                sent = 0

                async def worker() -> None:
                    nonlocal sent
                    while sent < count:
                        sent += 1
                        r = await http.post("/api/v1/tasks", json={"name": "bench.noop"})
                        r.raise_for_status()

                t0 = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(8)))
                self.figures["http_create_per_s"] = count / (time.perf_counter() - t0)
                latencies: list[float] = []
                t0 = time.perf_counter()
                for i in range(1000):
                    await asyncio.sleep(max(0.0, t0 + i / 200 - time.perf_counter()))
                    s = time.perf_counter()
                    (await http.post("/api/v1/tasks", json={"name": "bench.noop"})).raise_for_status()
                    latencies.append((time.perf_counter() - s) * 1000)
                self.figures["http_create_ms_at_200_per_s"] = (
                    pct(latencies, 0.5),
                    pct(latencies, 0.95),
                    pct(latencies, 0.99),
                )
        finally:
            self.stop_instance(proc)
        await self._pickup_latency()

    async def _pickup_latency(self) -> None:
        """Time the pickup as the peers' harness does (its ``prepare``): a fresh database after a
        ``CHECKPOINT``, a fresh instance, one untimed task, then ``--latency-count`` at ``--rate``.

        Not on the instance that served the HTTP creates: after a few thousand tasks the pickup
        was 0.7-0.8 ms slower at the median (docs/internals/benchmark-notebook.md, 2026-12-04, midday), and
        PgQueuer's is measured on a fresh worker and truncated tables.
        """
        import httpx

        await self.reset()
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute("CHECKPOINT")
        except asyncpg.InsufficientPrivilegeError:
            pass  # a role without pg_checkpoint: the figure is taken without it
        finally:
            await admin.close()
        port = _free_port()
        proc = self.start_instance(self.args.concurrency, port)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                await wait_ready(http)
            await self._time_pickups()
        finally:
            self.stop_instance(proc)

    async def _time_pickups(self) -> None:
        await asyncio.sleep(1.0)
        sent: dict[str, float] = {}
        async with self.recorder() as recorder:
            async with self.client() as client:
                # One task first, not timed, as the peers' harness does (common.WARMUP_IDX): the
                # client's first call opens its connections and prepares its statements.
                await recorder.delete(self.ran, self.start)
                await client.enqueue("bench.noop")
                await recorded(recorder, self.start, 1)
                await recorder.delete(self.ran, self.start)
                t0 = time.perf_counter()
                for i in range(self.args.latency_count):
                    await asyncio.sleep(max(0.0, t0 + i / self.args.rate - time.perf_counter()))
                    at = time.time()
                    task_id = await client.enqueue("bench.noop")
                    sent[str(task_id)] = at
            await recorded(recorder, self.start, len(sent))
            raw = await recorder.hgetall(self.start)
        starts = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}
        pickup = [(starts[t] - at) * 1000 for t, at in sent.items() if t in starts]
        self.figures["pickup_ms_at_rate"] = (pct(pickup, 0.5), pct(pickup, 0.95), pct(pickup, 0.99))
        self.figures["pickup_missing"] = len(sent) - len(pickup)


class _Progress:
    """How far a drain is: the recorder's count (``bench.noop``), or with ``watch`` (``--empty-handler``,
    whose handler records nothing) PostgreSQL's count of completed tasks, asked less often."""

    def __init__(self, recorder: aioredis.Redis, keys: tuple[str, str], watch: asyncpg.Connection | None) -> None:
        self.recorder = recorder
        self.ran, self.start = keys
        self.watch = watch
        self.interval = 0.01 if watch is None else 0.05

    async def done(self) -> int:
        """Tasks that ran."""
        if self.watch is None:
            return int(await self.recorder.hlen(self.ran))
        return int(await self.watch.fetchval("SELECT count(*) FROM tasks WHERE status = 'completed'"))

    async def first_start(self) -> float:
        """When the first handler started, in seconds since the epoch (this host's clock)."""
        if self.watch is None:
            return min(float(v) for v in await self.recorder.hvals(self.start))
        return float(await self.watch.fetchval("SELECT extract(epoch FROM min(started_at)) FROM task_runs"))


async def recorded(recorder: aioredis.Redis, key: str, count: int, within: float = 30.0) -> None:
    """Poll the recorder until hash ``key`` holds ``count`` task ids, or ``within`` seconds passed.

    Past the time it returns anyway: the caller counts what is missing.
    """
    deadline = time.monotonic() + within
    while await recorder.hlen(key) < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)


async def wait_ready(http: Any) -> None:
    """Poll ``GET /readyz`` of an instance starting up (an ``httpx.AsyncClient`` on it), up to 30 s."""
    import httpx

    for _ in range(300):
        try:
            if (await http.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)


def byte_compile() -> None:
    """Byte-compile taskmesh and the benchmark's handlers, so the instance starts as an installed one does.

    pip compiles what it installs (the Docker image runs ``pip install --compile``); an editable
    checkout compiles on first import, unless ``PYTHONDONTWRITEBYTECODE`` is set, as it is on some
    machines: then every start compiled about a hundred modules again, a tenth of a second or more of
    the drain's time from launch.
    """
    for package in (Path(taskmesh.__file__).parent, ROOT / "benchmarks"):
        compileall.compile_dir(package, quiet=1)


def database_name(text: str) -> str:
    """A ``--database`` value: a plain lower-case identifier (it is written into ``CREATE DATABASE``).

    :raises argparse.ArgumentTypeError: it is not one.
    """
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a plain lower-case identifier ([a-z_][a-z0-9_]*)")
    return text


def worker_processes(text: str) -> int | str:
    """``--worker-processes``: ``auto`` or a number from 1 to 256, as the setting takes it."""
    if text == "auto" or (text.isdigit() and 1 <= int(text) <= 256):
        return text if text == "auto" else int(text)
    raise argparse.ArgumentTypeError(f"must be auto or a number from 1 to 256, not {text!r}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.bench``; returns the exit status (1: a task did not run exactly once)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--tasks", type=int, default=20000, help="no-op tasks bulk-enqueued, then drained")
    parser.add_argument("--concurrency", type=int, default=32, help="the instance's executors")
    parser.add_argument(
        "--instances", type=int, default=1, help="instances draining side by side (their CPU is summed)"
    )
    parser.add_argument(
        "--worker-processes",
        type=worker_processes,
        default=1,
        help="each instance's worker_processes (auto: one per core); 1 for the every-core figure",
    )
    parser.add_argument("--prefetch", type=int, default=128, help="tasks claimed ahead (the prefetch setting)")
    parser.add_argument("--http", type=int, default=2000, help="single HTTP creates to time")
    parser.add_argument("--rate", type=int, default=50, help="tasks/s of the pickup-latency run")
    parser.add_argument("--latency-count", type=int, default=300, help="tasks of the pickup-latency run")
    parser.add_argument(
        "--skip-http",
        action="store_true",
        help="skip the single HTTP creates and the pickup latency (the every-core figure still runs)",
    )
    parser.add_argument(
        "--spin-tasks", type=int, default=1000, help="5 ms CPU-bound tasks of the every-core figure (0: skip it)"
    )
    parser.add_argument(
        "--pgbouncer",
        metavar="HOST:PORT",
        help="the instance and the client reach PostgreSQL through this PgBouncer (transaction mode)",
    )
    parser.add_argument(
        "--redis-cluster",
        metavar="HOST:PORT",
        help="the instance and the client dispatch through the Redis Cluster this node belongs to",
    )
    parser.add_argument(
        "--empty-handler",
        action="store_true",
        help="drain tasks whose handler does nothing (bench.empty) instead of the peers' job body: taskmesh's "
        "own CPU per task; progress and exactly once are read from PostgreSQL",
    )
    parser.add_argument(
        "--database",
        type=database_name,
        default=BENCH_DB,
        help="the database the benchmark DROPS (with FORCE) and creates; also the Redis key prefix of its tasks "
        "and the name of its recorder's hashes",
    )
    parser.add_argument("--compare", action="store_true", help="also run PgQueuer, arq and Celery")
    parser.add_argument("--peers-dir", default=str(Path.cwd().parent / "shared" / "bench" / "peers"))
    parser.add_argument("--peers-venv", default=str(Path(tempfile.gettempdir()) / "taskmesh-bench-peers-venv"))
    args = parser.parse_args(argv)
    if args.empty_handler and args.compare:
        parser.error(
            "--empty-handler cannot be used with --compare: it measures taskmesh alone, the peers run their job body"
        )
    byte_compile()
    bench = Bench(args)
    asyncio.run(bench.enqueue_and_drain())
    if not args.skip_http:
        asyncio.run(bench.http_and_latency())
    if args.spin_tasks:
        asyncio.run(bench.spin())
    peers = (
        run_peers(args.peers_dir, args.peers_venv, bench.admin_url, args.tasks, args.latency_count, args.rate)
        if args.compare
        else None
    )
    print_report(bench.figures, peers, args)
    return 0 if bench.figures["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
