"""The peers of ``bench --compare``: PgQueuer, arq and Celery through ``shared/bench/peers``.

The harness is copied to a temporary folder and run from a virtual environment of its
own (created on first use with the peers' pinned versions), against database ``bench``
of the server of the benchmark's ``DATABASE_URL`` and the same Redis. Each system runs
exactly once per step; the best configuration of each system's throughput runs counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.measure import with_db

PEERS = ("pgqueuer", "arq", "celery")
PEERS_DB = "bench"
_PINNED = {"pgqueuer", "arq", "celery", "asyncpg", "psycopg", "psycopg-pool", "redis", "hiredis"}


def _venv_python(source: Path, venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pins = [
            line.strip()
            for line in (source / "requirements-peers.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#") and line.split("==")[0].split("[")[0] in _PINNED
        ]
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True)
    return python


async def _ensure_database(admin_url: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", PEERS_DB):
            await admin.execute(f"CREATE DATABASE {PEERS_DB}")
    finally:
        await admin.close()


def run_peers(
    peers_dir: str, peers_venv: str, admin_url: str, tasks: int, latency_count: int, rate: int
) -> dict[str, dict[str, Any]]:
    """Run the harness's throughput step (every peer once) and its PgQueuer latency step.

    :param admin_url: the benchmark's ``DATABASE_URL``; the peers use database ``bench`` of its server.
    :returns: by system: ``drain_per_s`` and ``config`` of its best drain, ``enqueue_per_s`` (its best
        bulk enqueue, whatever the worker's configuration), ``exactly_once``,
        ``cpu_us_per_task`` (the worker's CPU per task: the harness measures it) and, for
        PgQueuer, ``pickup_ms`` (p50, p95, p99).
    :raises SystemExit: no harness at ``peers_dir``.
    :raises subprocess.CalledProcessError: a harness step failed.
    """
    source = Path(peers_dir).resolve()
    if not (source / "run.py").is_file():
        raise SystemExit(f"bench: no peers harness at {source} (use --peers-dir)")
    python = _venv_python(source, Path(peers_venv))
    asyncio.run(_ensure_database(admin_url))
    work = Path(tempfile.mkdtemp(prefix="taskmesh-peers-"))
    try:
        shutil.copytree(source, work / "peers", ignore=shutil.ignore_patterns("results"))
        harness = work / "peers"
        env = {**os.environ, "QB_PG_DSN": with_db(admin_url, PEERS_DB)}
        steps = [
            ["throughput", "--systems", ",".join(PEERS), "--reps", "1", "--n", str(tasks)],
            ["latency", "--systems", "pgqueuer", "--reps", "1", "--count", str(latency_count), "--rate", str(rate)],
        ]
        for step in steps:
            subprocess.run([str(python), "run.py", *step], cwd=harness, env=env, check=True)
        return _read_results(harness / "results" / "runs.jsonl")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _read_results(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        run = json.loads(line)
        entry = out.setdefault(run["system"], {})
        if run["kind"] == "throughput":
            # Enqueueing does not depend on the worker's configuration: the best run's rate counts.
            entry["enqueue_per_s"] = max(entry.get("enqueue_per_s", 0.0), run["enqueue_rate"])
            if run["drain_rate"] > entry.get("drain_per_s", 0):
                cores = (run.get("cpu") or {}).get("worker_cores")
                entry.update(
                    drain_per_s=run["drain_rate"],
                    config=run["config"],
                    exactly_once=run["exactly_once"]["ok"],
                    startup_s=run.get("startup_s"),
                    cpu_us_per_task=cores / run["drain_rate"] * 1e6 if cores and run["drain_rate"] else None,
                )
        elif run["kind"] == "latency" and "p99" in run:
            entry["pickup_ms"] = (run["p50"], run["p95"], run["p99"])
    return out
