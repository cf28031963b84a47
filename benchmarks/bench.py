"""``python -m benchmarks.bench``: how much work one instance pushes through, and how soon a task starts.

Run it from the repository root with the venv's Python
(``.venv/bin/python -m benchmarks.bench --tasks 20000``, or
``make bench ARGS="--tasks 20000"``); it is not part of the installed package.

It creates a database ``taskmesh_bench`` on the PostgreSQL of ``DATABASE_URL``
(default ``postgresql://postgres@127.0.0.1:5432/postgres``; the role must be
allowed to create databases) and uses the Redis of ``REDIS_URL`` (default
``redis://127.0.0.1:6379/0``, recorder in db 15), then:

1. **bulk enqueue**: ``--tasks`` no-op tasks through ``Client.enqueue_many``
   (1,000 per call: one statement and one pipeline each);
2. **drain**: starts one instance (``python -m taskmesh`` with the handler
   module ``benchmarks.bench_handler``, found through ``PYTHONPATH``;
   ``--concurrency`` executors, durable: ``synchronous_commit`` as the server has it) and times
   it from launch until every task ran, with the CPU seconds of the instance,
   of PostgreSQL and of Redis, and the instance's peak RSS; then checks that
   every task ran exactly once (the recorder) and is ``completed`` with one run;
3. **single HTTP creates**: ``--http`` ``POST /api/v1/tasks`` from 8
   connections (tasks/s), then 1,000 at a steady 200 requests/s (latency);
4. **pickup latency**: ``--latency-count`` tasks enqueued one by one at
   ``--rate`` per second, from the enqueue call to the handler's start;
5. ``--memory``: RSS of the instance after 10% and after 100% of the drain;
6. ``--pgbouncer HOST:PORT``: the instance and the client reach PostgreSQL through a
   PgBouncer in transaction mode (``pg_pooler = "transaction"``); set-up goes direct;
   ``--redis-cluster HOST:PORT``: they dispatch through the Redis Cluster of which that is a
   node (``redis_mode = "cluster"``); the recorder stays on ``REDIS_URL``;
7. ``--compare``: the same drain and latency workloads through PgQueuer, arq
   and Celery, with the peers harness of ``shared/bench/peers`` (copied to a
   temporary folder and run from a virtual environment of its own that this
   command creates, with the peers' pinned versions), and the ratios
   taskmesh/peer.

Every figure printed is measured in this run; nothing is remembered between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import redis

from benchmarks.bench_handler import RAN, START
from taskmesh.client import Client
from taskmesh.store.postgres import migrate_url
from taskmesh.store.redis_clients import RedisMode

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: the instance's ``PYTHONPATH`` starts with it, so it imports ``benchmarks.bench_handler``."""
CLK = os.sysconf("SC_CLK_TCK")
PEERS = ("pgqueuer", "arq", "celery")
BENCH_DB = "taskmesh_bench"
PREFIX = "tmbench"


def _cpu_of(pid: int) -> float:
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(rest[11]) + int(rest[12])) / CLK


def _cpu_by_name(names: tuple[str, ...]) -> float:
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm in names:
                total += _cpu_of(int(entry.name))
    return total


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def _through(url: str, address: str) -> str:
    """``url`` with its host and port replaced by ``address``, keeping its user and database."""
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit((parts.scheme, user + address, parts.path, parts.query, parts.fragment))


class Bench:
    """One benchmark run (see the module docs); ``figures`` collects what is printed."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.admin_url = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
        self.redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        self.db_url = _with_db(self.admin_url, BENCH_DB)
        # The instance and the client go through PgBouncer with --pgbouncer; set-up goes direct.
        self.pooler = "transaction" if args.pgbouncer else "none"
        self.work_url = _through(self.db_url, args.pgbouncer) if args.pgbouncer else self.db_url
        # The instance and the client dispatch through a Redis Cluster with --redis-cluster.
        self.redis_mode: RedisMode = "cluster" if args.redis_cluster else "standalone"
        self.work_redis = f"redis://{args.redis_cluster}/0" if args.redis_cluster else self.redis_url
        parts = urlsplit(self.redis_url)
        self.recorder_url = urlunsplit((parts.scheme, parts.netloc, "/15", "", ""))
        self.recorder = redis.Redis.from_url(self.recorder_url)
        self.figures: dict[str, Any] = {}

    async def reset(self) -> None:
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
            await admin.execute(f"CREATE DATABASE {BENCH_DB}")
        finally:
            await admin.close()
        await migrate_url(self.db_url)
        client = (redis.RedisCluster if self.redis_mode == "cluster" else redis.Redis).from_url(self.work_redis)
        keys = list(client.scan_iter(match=f"{PREFIX}:*", count=1000))
        if keys:
            client.delete(*keys)
        self.recorder.delete(RAN, START)

    def start_instance(self, concurrency: int, port: int = 0) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "DATABASE_URL": self.work_url,
            "TASKMESH_PG_POOLER": self.pooler,
            "REDIS_URL": self.work_redis,
            "TASKMESH_REDIS_MODE": self.redis_mode,
            "TASKMESH_REDIS_PREFIX": PREFIX,
            # The instance imports the handler from this checkout, whatever its working directory.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "TASKMESH_HANDLERS": "benchmarks.bench_handler",
            "TASKMESH_BENCH_RECORDER_URL": self.recorder_url,
            "WORKER_CONCURRENCY": str(concurrency),
            "TASKMESH_PREFETCH": str(self.args.prefetch),
            "HTTP_PORT": str(port),
            "TASKMESH_LOG_LEVEL": "warning",
            "TASKMESH_MIGRATE_ON_START": "false",
        }
        return subprocess.Popen([sys.executable, "-m", "taskmesh"], env=env, stdout=subprocess.DEVNULL)

    @staticmethod
    def stop_instance(proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    async def enqueue_and_drain(self) -> None:
        n, concurrency = self.args.tasks, self.args.concurrency
        await self.reset()
        async with Client(
            self.work_url, self.work_redis, redis_prefix=PREFIX, pg_pooler=self.pooler, redis_mode=self.redis_mode
        ) as client:
            t0 = time.perf_counter()
            for start in range(0, n, 1000):
                await client.enqueue_many([{"name": "bench.noop"} for _ in range(min(1000, n - start))])
            self.figures["bulk_enqueue_per_s"] = n / (time.perf_counter() - t0)
        pg0, rd0 = _cpu_by_name(("postgres",)), _cpu_by_name(("redis-server", "valkey-server"))
        t0 = time.perf_counter()
        proc = self.start_instance(concurrency)
        rss_at_10pct = 0
        try:
            while (done := self.recorder.hlen(RAN)) < n:
                if not rss_at_10pct and done >= n // 10:
                    rss_at_10pct = _rss_kib(proc.pid)
                if proc.poll() is not None:
                    raise RuntimeError(f"the instance exited with {proc.returncode} after {done} of {n} tasks")
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError(f"drain did not finish in 600 s ({done} of {n})")
                await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - t0
            cpu = _cpu_of(proc.pid)
            self.figures.update(
                drain_per_s=n / elapsed,
                drain_seconds=elapsed,
                instance_cpu_us_per_task=cpu / n * 1e6,
                postgres_cpu_us_per_task=(_cpu_by_name(("postgres",)) - pg0) / n * 1e6,
                redis_cpu_us_per_task=(_cpu_by_name(("redis-server", "valkey-server")) - rd0) / n * 1e6,
                peak_rss_mib=_rss_kib(proc.pid, "VmHWM") / 1024,
                rss_after_10pct_mib=rss_at_10pct / 1024,
                rss_after_100pct_mib=_rss_kib(proc.pid) / 1024,
            )
            await asyncio.sleep(1.5)  # late duplicates would show up now
        finally:
            self.stop_instance(proc)
        counts = [int(v) for v in self.recorder.hvals(RAN)]
        conn = await asyncpg.connect(self.db_url)
        try:
            completed = await conn.fetchval("SELECT count(*) FROM tasks WHERE status = 'completed'")
            runs = await conn.fetchval("SELECT count(*) FROM task_runs")
        finally:
            await conn.close()
        self.figures["exactly_once"] = len(counts) == n and all(c == 1 for c in counts) and completed == n and runs == n
        self.figures["exactly_once_detail"] = (
            f"ran={len(counts)} duplicated={sum(1 for c in counts if c > 1)} completed={completed} runs={runs}"
        )

    async def http_and_latency(self) -> None:
        import httpx  # the benchmark's HTTP client (a dev dependency)

        await self.reset()
        port = _free_port()
        proc = self.start_instance(self.args.concurrency, port)
        base = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                for _ in range(300):
                    try:
                        if (await http.get("/readyz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.1)
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
                    _pct(latencies, 0.5),
                    _pct(latencies, 0.95),
                    _pct(latencies, 0.99),
                )
            await self._pickup_latency()
        finally:
            self.stop_instance(proc)

    async def _pickup_latency(self) -> None:
        await asyncio.sleep(1.0)
        self.recorder.delete(RAN, START)
        sent: dict[str, float] = {}
        async with Client(
            self.work_url, self.work_redis, redis_prefix=PREFIX, pg_pooler=self.pooler, redis_mode=self.redis_mode
        ) as client:
            t0 = time.perf_counter()
            for i in range(self.args.latency_count):
                await asyncio.sleep(max(0.0, t0 + i / self.args.rate - time.perf_counter()))
                at = time.time()
                task_id = await client.enqueue("bench.noop")
                sent[str(task_id)] = at
        deadline = time.monotonic() + 30
        while self.recorder.hlen(START) < len(sent) and time.monotonic() < deadline:  # noqa: ASYNC110  # polls Redis
            await asyncio.sleep(0.05)
        raw: dict[bytes, bytes] = self.recorder.hgetall(START)  # type: ignore[assignment]  # sync client, bytes
        starts = {k.decode(): float(v) for k, v in raw.items()}
        pickup = [(starts[t] - at) * 1000 for t, at in sent.items() if t in starts]
        self.figures["pickup_ms_at_rate"] = (_pct(pickup, 0.5), _pct(pickup, 0.95), _pct(pickup, 0.99))
        self.figures["pickup_missing"] = len(sent) - len(pickup)

    def compare(self) -> dict[str, dict[str, Any]]:
        """Run the peers harness for PgQueuer, arq and Celery; returns their figures by system."""
        source = Path(self.args.peers_dir).resolve()
        if not (source / "run.py").is_file():
            raise SystemExit(f"bench: no peers harness at {source} (use --peers-dir)")
        venv = Path(self.args.peers_venv)
        python = venv / "bin" / "python"
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pins = [
                line.strip()
                for line in (source / "requirements-peers.txt").read_text().splitlines()
                if line.strip()
                and not line.startswith("#")
                and line.split("==")[0].split("[")[0]
                in {"pgqueuer", "arq", "celery", "asyncpg", "psycopg", "psycopg-pool", "redis", "hiredis"}
            ]
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True)
        work = Path(tempfile.mkdtemp(prefix="taskmesh-peers-"))
        shutil.copytree(source, work / "peers", ignore=shutil.ignore_patterns("results"))
        harness = work / "peers"
        env = {**os.environ, "QB_PG_DSN": _with_db(self.admin_url, "bench"), "PGPASSWORD": "postgres"}
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-c", "CREATE DATABASE bench"],
            env=env,
            capture_output=True,
        )
        n = str(self.args.tasks)
        steps = [
            ["throughput", "--systems", ",".join(PEERS), "--reps", "1", "--n", n],
            [
                "latency",
                "--systems",
                "pgqueuer",
                "--reps",
                "1",
                "--count",
                str(self.args.latency_count),
                "--rate",
                str(self.args.rate),
            ],
        ]
        for step in steps:
            subprocess.run([str(python), "run.py", *step], cwd=harness, env=env, check=True)
        out: dict[str, dict[str, Any]] = {}
        for line in (harness / "results" / "runs.jsonl").read_text().splitlines():
            run = json.loads(line)
            entry = out.setdefault(run["system"], {})
            if run["kind"] == "throughput":
                best = entry.get("drain_per_s", 0)
                if run["drain_rate"] > best:
                    entry.update(
                        drain_per_s=run["drain_rate"],
                        enqueue_per_s=run["enqueue_rate"],
                        config=run["config"],
                        exactly_once=run["exactly_once"]["ok"],
                    )
            elif run["kind"] == "latency" and "p99" in run:
                entry["pickup_ms"] = (run["p50"], run["p95"], run["p99"])
        shutil.rmtree(work, ignore_errors=True)
        return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _print(figures: dict[str, Any], peers: dict[str, dict[str, Any]] | None, args: argparse.Namespace) -> None:
    f = figures
    print(
        f"\ntaskmesh bench: {args.tasks} no-op tasks, one instance, concurrency {args.concurrency}, "
        f"{os.cpu_count()} cores"
    )
    print(f"  bulk enqueue            {f['bulk_enqueue_per_s']:>10.0f} tasks/s")
    print(f"  drain (from launch)     {f['drain_per_s']:>10.0f} tasks/s  ({f['drain_seconds']:.1f} s)")
    print(
        f"  CPU per task            instance {f['instance_cpu_us_per_task']:.0f} us, "
        f"postgres {f['postgres_cpu_us_per_task']:.0f} us, redis {f['redis_cpu_us_per_task']:.0f} us"
    )
    print(
        f"  RSS                     peak {f['peak_rss_mib']:.1f} MiB; after 10% {f['rss_after_10pct_mib']:.1f} MiB, "
        f"after 100% {f['rss_after_100pct_mib']:.1f} MiB"
    )
    print(f"  exactly once            {'yes' if f['exactly_once'] else 'NO'} ({f['exactly_once_detail']})")
    if "http_create_per_s" in f:
        p = f["http_create_ms_at_200_per_s"]
        print(
            f"  single HTTP create      {f['http_create_per_s']:>10.0f} tasks/s (8 connections); "
            f"at 200/s p50 {p[0]:.2f} / p95 {p[1]:.2f} / p99 {p[2]:.2f} ms"
        )
        q = f["pickup_ms_at_rate"]
        print(
            f"  pickup at {args.rate}/s         p50 {q[0]:.2f} / p95 {q[1]:.2f} / p99 {q[2]:.2f} ms "
            f"({f['pickup_missing']} missing)"
        )
    if peers:
        print("\n  peer        drain/s  enqueue/s  pickup p99 ms   taskmesh/peer: drain  bulk enqueue  pickup p99")
        for system, e in peers.items():
            pick = e.get("pickup_ms", (None, None, None))[2]
            drain = f["drain_per_s"] / e["drain_per_s"] if e.get("drain_per_s") else float("nan")
            enq = f["bulk_enqueue_per_s"] / e["enqueue_per_s"] if e.get("enqueue_per_s") else float("nan")
            mine = f.get("pickup_ms_at_rate", (None, None, None))[2]
            lat = f"{mine / pick:.2f}x" if pick and mine else "-"
            shown = f"{pick:.1f}" if pick is not None else "-"
            print(
                f"  {system:<10} {e.get('drain_per_s', 0):>8.0f} {e.get('enqueue_per_s', 0):>10.0f} {shown:>14}"
                f"   {drain:>19.2f}x {enq:>12.2f}x {lat:>11}   ({e.get('config', '')})"
            )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.bench``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--prefetch", type=int, default=128, help="tasks claimed ahead (the prefetch setting; default 128)"
    )
    parser.add_argument("--http", type=int, default=2000, help="single HTTP creates to time")
    parser.add_argument("--rate", type=int, default=50, help="tasks/s of the pickup-latency run")
    parser.add_argument("--latency-count", type=int, default=300)
    parser.add_argument("--skip-http", action="store_true", help="only enqueue and drain")
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
    parser.add_argument("--compare", action="store_true", help="also run PgQueuer, arq and Celery")
    parser.add_argument("--peers-dir", default=str(Path.cwd().parent / "shared" / "bench" / "peers"))
    parser.add_argument("--peers-venv", default=str(Path(tempfile.gettempdir()) / "taskmesh-bench-peers-venv"))
    args = parser.parse_args(argv)
    bench = Bench(args)
    asyncio.run(bench.enqueue_and_drain())
    if not args.skip_http:
        asyncio.run(bench.http_and_latency())
    peers = bench.compare() if args.compare else None
    _print(bench.figures, peers, args)
    return 0 if bench.figures["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
