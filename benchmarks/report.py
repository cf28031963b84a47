"""The benchmark's printout: taskmesh's figures, then one table of each figure beside each peer's.

A ratio is taskmesh's figure over the peer's, from the same run; for a time
(pickup latency, CPU per task) a ratio below 1 is in taskmesh's favour, for a rate above 1.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

PEER_ORDER = ("pgqueuer", "arq", "celery")


def _ratio(mine: float | None, theirs: float | None) -> str:
    return f"{mine / theirs:.2f}x" if mine and theirs else "-"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _kind(args: argparse.Namespace) -> str:
    """What the drained tasks do."""
    if getattr(args, "empty_handler", False):
        return "tasks of a handler that does nothing (--empty-handler: taskmesh's own cost)"
    return "no-op tasks"


def _instances(args: argparse.Namespace) -> str:
    n = getattr(args, "instances", 1)
    processes = getattr(args, "worker_processes", 1)
    each = "" if processes == 1 else f" of worker_processes = {processes} (their CPU counted)"
    return ("one instance" if n == 1 else f"{n} instances (CPU summed, RSS of the first)") + each


def print_report(figures: dict[str, Any], peers: dict[str, dict[str, Any]] | None, args: argparse.Namespace) -> None:
    """Print ``figures`` (:class:`benchmarks.bench.Bench`'s) and, with ``peers``, the comparison table."""
    f = figures
    print(
        f"\ntaskmesh bench: {args.tasks} {_kind(args)}, {_instances(args)}, concurrency {args.concurrency}, "
        f"{os.cpu_count()} cores"
    )
    runs = ", ".join(f"{rate:.0f}" for rate in f.get("bulk_enqueue_runs", []))
    print(
        f"  bulk enqueue            {f['bulk_enqueue_per_s']:>10.0f} tasks/s" + (f"  (best of {runs})" if runs else "")
    )
    print(
        f"  drain (from launch)     {f['drain_per_s']:>10.0f} tasks/s  ({f['drain_seconds']:.1f} s; "
        f"the first task started {f['startup_seconds']:.2f} s after launch)"
    )
    print(
        f"  CPU per task            instance {f['instance_cpu_us_per_task']:.0f} us, "
        f"postgres (its backends) {f['postgres_cpu_us_per_task']:.0f} us, redis {f['redis_cpu_us_per_task']:.0f} us; "
        f"total {_total_cpu(f):.0f} us"
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
    if "spin_per_s_1" in f:
        one, two = f["spin_per_s_1"], f["spin_per_s_2"]
        print(
            f"  every core              {args.spin_tasks} tasks of 5 ms pure Python (def handler): "
            f"1 process {one:.0f} tasks/s, 2 processes {two:.0f} tasks/s ({two / one:.2f}x)"
        )
    if peers:
        _print_table(f, peers)


def _total_cpu(f: dict[str, Any]) -> float:
    return float(f["instance_cpu_us_per_task"] + f["postgres_cpu_us_per_task"] + f["redis_cpu_us_per_task"])


def _print_table(f: dict[str, Any], peers: dict[str, dict[str, Any]]) -> None:
    systems = [s for s in PEER_ORDER if s in peers]
    pickup = f.get("pickup_ms_at_rate")
    rows: list[tuple[str, float | None, dict[str, float | None], int]] = [
        ("drain, tasks/s", f["drain_per_s"], {s: peers[s].get("drain_per_s") for s in systems}, 0),
        ("start-up, s", f["startup_seconds"], {s: peers[s].get("startup_s") for s in systems}, 2),
        ("bulk enqueue, tasks/s", f["bulk_enqueue_per_s"], {s: peers[s].get("enqueue_per_s") for s in systems}, 0),
        (
            "pickup p50, ms",
            pickup[0] if pickup else None,
            {s: peers[s].get("pickup_ms", (None,) * 3)[0] for s in systems},
            2,
        ),
        (
            "pickup p99, ms",
            pickup[2] if pickup else None,
            {s: peers[s].get("pickup_ms", (None,) * 3)[2] for s in systems},
            2,
        ),
        (
            "CPU/task, worker, us",
            f["instance_cpu_us_per_task"],
            {s: peers[s].get("cpu_us_per_task") for s in systems},
            0,
        ),
    ]
    head = f"  {'figure':<22} {'taskmesh':>10}" + "".join(f" {s:>10}" for s in systems)
    head += "".join(f" {'/' + s:>10}" for s in systems)
    print("\n  side by side (this run; ratio = taskmesh / peer; bulk enqueue: the best of two runs, as PgQueuer's)")
    print(head)
    for label, mine, theirs, digits in rows:
        line = f"  {label:<22} {_num(mine, digits):>10}"
        line += "".join(f" {_num(theirs[s], digits):>10}" for s in systems)
        line += "".join(f" {_ratio(mine, theirs[s]):>10}" for s in systems)
        print(line)
    print("  configurations: " + "; ".join(f"{s} {peers[s].get('config', '')}" for s in systems))
