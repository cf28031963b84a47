"""``python -m taskmesh schedules [list|trigger|pause|resume] [NAME]``: the operator's verbs on cron schedules.

Talks to PostgreSQL and Redis directly (``DATABASE_URL``, ``REDIS_URL``), so it
works whether or not an instance serves the API; the same operations as
``/api/v1/schedules``. A sleeping scheduler learns of a pause or resume through
PostgreSQL ``NOTIFY`` at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio
import orjson

from taskmesh.config import Settings
from taskmesh.errors import ScheduleNotFoundError
from taskmesh.schedules import Schedules
from taskmesh.store import Stores
from taskmesh.tasks import Tasks


def add_parser(sub: Any) -> None:
    """Register the ``schedules`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("schedules", help="list, trigger, pause or resume cron schedules")
    p.add_argument("action", nargs="?", default="list", choices=["list", "trigger", "pause", "resume"])
    p.add_argument("name", nargs="?", help="the schedule (all but list)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--idempotency-key", help="trigger: the task's idempotency key (default: a new one)")


def _table(items: list[dict[str, Any]]) -> str:
    header = ("NAME", "CRON", "TIMEZONE", "STATE", "LAST FIRE (local)", "NEXT FIRE (local)")
    rows = [header]
    for s in items:
        state = s["state"] if not s["error"] else f"error: {s['error']}"
        last = (s["last_fire"]["local"] or s["last_fire"]["utc"]) if s["last_fire"] else "-"
        nxt = s["next_fires"][0]["local"] if s["next_fires"] else "-"
        rows.append((s["name"], s["cron"], s["timezone"], state, last, nxt))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run(settings: Settings, args: argparse.Namespace) -> int:
    """Carry out one verb; returns the exit status (1: no such schedule).

    :raises ConfigError: ``DATABASE_URL``/``REDIS_URL`` missing.
    """
    if args.action != "list" and not args.name:
        print(f"taskmesh: error: schedules {args.action} needs a schedule name", file=sys.stderr)
        return 2
    if not settings.database_url or not settings.redis_url:
        print(
            "taskmesh: error: schedules needs DATABASE_URL and REDIS_URL (the deployment's stores, as the "
            "instances have them); against the dev profile use its HTTP API: "
            "curl localhost:8080/api/v1/schedules",
            file=sys.stderr,
        )
        return 2
    database_url, redis_url = settings.database_url, settings.redis_url

    async def go() -> int:
        stores = await Stores.open(database_url, redis_url, redis_prefix=settings.redis_prefix, pool_size=2)
        try:
            tasks = Tasks(stores.pg, stores.redis, default_max_retries=settings.default_max_retries)
            schedules = Schedules(tasks, [])
            try:
                if args.action == "list":
                    items = await schedules.list()
                    print(orjson.dumps({"schedules": items}).decode() if args.json else _table(items))
                elif args.action == "trigger":
                    task_id, key, created = await schedules.trigger(args.name, args.idempotency_key)
                    answer = {
                        "schedule": args.name,
                        "task_id": str(task_id),
                        "idempotency_key": key,
                        "created": created,
                    }
                    print(
                        orjson.dumps(answer).decode()
                        if args.json
                        else f"{'created' if created else 'exists'} task {task_id} ({key})"
                    )
                else:
                    item = await schedules.set_paused(args.name, args.action == "pause")
                    print(
                        orjson.dumps(item).decode()
                        if args.json
                        else f"{args.name}: {'paused' if item['paused'] else 'active'}"
                    )
            except ScheduleNotFoundError as exc:
                print(f"taskmesh: error: {exc}", file=sys.stderr)
                return 1
        finally:
            await stores.close()
        return 0

    return anyio.run(go)
