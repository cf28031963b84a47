"""What the benchmark reads off this machine: CPU seconds and RSS of processes, percentiles, URLs.

CPU comes from ``/proc/<pid>/stat`` (user + system clock ticks), so only Linux runs the
benchmark. PostgreSQL's CPU is that of the backends serving one database (found in
``pg_stat_activity``), not every ``postgres`` process on the host: other users' load and
PostgreSQL's own background writers are left out.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

CLK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used; 0.0 once it is gone."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(rest[11]) + int(rest[12])) / CLK


def cpu_of_tree(pid: int) -> float:
    """CPU seconds of process ``pid``, of its descendants alive now, and of those it has waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    reaped = (int(fields[13]) + int(fields[14])) / CLK  # cutime + cstime
    return cpu_of(pid) + reaped + sum(cpu_of_tree(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(p) for p in (task / "children").read_text().split()]
    except OSError:  # it ended while we looked
        pass
    return found


def cpu_by_name(names: tuple[str, ...]) -> dict[int, float]:
    """CPU seconds used by each process whose command name is in ``names`` (``redis-server``), by pid."""
    found: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm in names:
                found[int(entry.name)] = cpu_of(int(entry.name))
    return found


def cpu_since(before: dict[int, float], names: tuple[str, ...]) -> float:
    """CPU seconds the processes of ``before`` (:func:`cpu_by_name`) used since, those still there.

    Processes that ended or began in between are left out: a server another program stopped
    meanwhile would otherwise take its whole past off the sum.
    """
    now = cpu_by_name(names)
    return sum(max(0.0, now[pid] - cpu) for pid, cpu in before.items() if pid in now)


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """``field`` of ``/proc/<pid>/status`` in KiB (``VmRSS`` now, ``VmHWM`` the peak); 0 when absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank); ``values`` must not be empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def with_db(url: str, name: str) -> str:
    """``url`` naming database ``name`` instead of its own."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def through(url: str, address: str) -> str:
    """``url`` with its host and port replaced by ``address``, keeping its user and database."""
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit((parts.scheme, user + address, parts.path, parts.query, parts.fragment))


class BackendCpu:
    """CPU seconds of the PostgreSQL backends serving one database, however short-lived.

    :meth:`poll` (call it every ~0.2 s while the work runs) remembers each backend's CPU
    as last seen, so one that disconnects before the end still counts up to its last
    poll. PostgreSQL must run on this host (the backends' ``/proc`` entries are read).
    """

    def __init__(self, admin: asyncpg.Connection, database: str, exclude: set[int] | None = None) -> None:
        """:param admin: a connection to any other database of the server; ``database``: whose backends;
        ``exclude``: backends (pids) of the database not to count (the benchmark's own)."""
        self.admin = admin
        self.database = database
        self.exclude = exclude or set()
        self.seen: dict[int, float] = {}
        self.base: dict[int, float] = {}

    async def start(self) -> None:
        """Take the backends' CPU now as the baseline: only what they use from now on counts."""
        await self.poll()
        self.base = dict(self.seen)

    async def poll(self) -> None:
        """Read the CPU of every backend of the database now."""
        pids = await self.admin.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", self.database)
        for row in pids:
            if row["pid"] in self.exclude:
                continue
            cpu = cpu_of(row["pid"])
            if cpu:
                self.seen[row["pid"]] = max(cpu, self.seen.get(row["pid"], 0.0))

    def total(self) -> float:
        """CPU seconds every backend seen has used since :meth:`start`."""
        return sum(cpu - self.base.get(pid, 0.0) for pid, cpu in self.seen.items())
