"""A side's own code prepares a benchmark database: ``python -m benchmarks.plain_fill migrate URL`` or ``enqueue``.

``benchmarks.workflows`` runs it with the side's ``src`` first on ``PYTHONPATH`` (this
checkout's, or the baseline commit's), so that each side's database is migrated by its own
migrations and filled by its own client, as its instance expects:

- ``migrate URL``: apply the migrations of the ``taskmesh`` imported to database ``URL``;
- ``enqueue URL REDIS_URL PREFIX N NAME``: enqueue ``N`` tasks of handler ``NAME`` without payload
  through ``Client.enqueue_many``, 1,000 a call (one transaction and one pipeline each), as
  ``benchmarks.bench`` does.

It prints one JSON line: ``{"seconds": s}``, the wall time of the work (imports and connecting
left out of it, the enqueue's pool opening included). Only APIs that the baseline commit has are
used here.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from taskmesh.clients.client import Client
from taskmesh.store.postgres import migrate_url

BATCH = 1000
"""Tasks per ``enqueue_many`` call, as ``benchmarks.bench``'s bulk enqueue."""


async def enqueue(url: str, redis_url: str, prefix: str, n: int, name: str) -> float:
    """Enqueue ``n`` tasks of ``name``; returns the seconds it took (the pool's opening included)."""
    t0 = time.perf_counter()
    async with Client(url, redis_url, redis_prefix=prefix) as client:
        for start in range(0, n, BATCH):
            await client.enqueue_many([{"name": name} for _ in range(min(BATCH, n - start))])
    return time.perf_counter() - t0


async def migrate(url: str) -> float:
    """Apply every migration to ``url``; returns the seconds it took."""
    t0 = time.perf_counter()
    await migrate_url(url)
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    """Entry point (see the module docs); returns the exit status (2: unknown arguments)."""
    if len(argv) == 2 and argv[0] == "migrate":
        seconds = asyncio.run(migrate(argv[1]))
    elif len(argv) == 6 and argv[0] == "enqueue":
        seconds = asyncio.run(enqueue(argv[1], argv[2], argv[3], int(argv[4]), argv[5]))
    else:
        usage = "usage: python -m benchmarks.plain_fill migrate URL | enqueue URL REDIS_URL PREFIX N NAME"
        print(usage, file=sys.stderr)
        return 2
    print(json.dumps({"seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
