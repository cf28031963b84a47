"""The migration lock table (``benchmarks/migration_locks.py``, docs/guides/upgrading.md) has every migration file."""

from __future__ import annotations

import re

import pytest

from benchmarks.locks import MODES, mode_name
from benchmarks.migration_locks import files, markdown, measure
from tests.conftest import scratch_database

pytestmark = pytest.mark.anyio

ROWS = 2_000
MODE = "|".join(mode_name(m) for m in MODES)
SECONDS = r"(< )?\d+\.\d\d s"
LOCKS = re.compile(rf"none|(\w+: ({MODE}))(; \w+: ({MODE}))*(; new: [\w, ]+)?|new: [\w, ]+")


def table_rows(table: str) -> dict[str, list[str]]:
    """The table's rows by migration (``0013_tenancy``), each as its cells."""
    found = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        match = re.match(r"`(\d{4}_\w+)`", cells[0]) if cells else None
        if match:
            assert match.group(1) not in found, f"{match.group(1)} twice"
            found[match.group(1)] = cells
    return found


async def test_every_migration_file_has_a_row_with_the_locks_it_took(store_urls: tuple[str, str]) -> None:
    async with scratch_database(store_urls[0], "tm_locks") as url:
        measured = await measure(url, ROWS, interval=0.005, progress=False)
    table = markdown(measured, ROWS)

    rows = table_rows(table)
    assert list(rows) == [f"{f.version:04d}_{f.name}" for f in files()], table
    for name, (_, _, locks, took, write, read) in rows.items():
        assert LOCKS.fullmatch(locks), (name, locks)
        assert re.fullmatch(rf"{SECONDS}( \(no tasks yet\))?", took), (name, took)
        # the probes waited on tasks from the first migration that found it
        waits = "–" if name == "0001_tasks_and_runs" else SECONDS
        assert re.fullmatch(waits, write) and re.fullmatch(waits, read), (name, write, read)
    # the fill ran on the schema of its moment: every migration after 0001 met the tasks
    assert [m.tasks for m in measured[1:]] == [ROWS] * (len(measured) - 1)
    # an index built without CONCURRENTLY holds SHARE on tasks, which blocks its writers
    blocking = re.compile(r"\btasks: (SHARE|SHARE ROW EXCLUSIVE|EXCLUSIVE|ACCESS EXCLUSIVE)(;|$)")
    assert any(blocking.search(locks) for _, _, locks, *_ in rows.values())
    # each probe took its lock at least once during each migration after 0001, and each wait is a wait
    for m in measured[1:]:
        assert m.write_waits and m.read_waits, m.name
        assert all(0 < w < m.seconds + 5 for w in m.write_waits + m.read_waits), m.name
    # the copy in batches committed after each batch, as taskmesh migrate runs it: outside a transaction block
    copy = next(m for m in measured if m.name == "task_search_table")
    assert any(s.startswith("DO $$") and "COMMIT" in s for s in copy.outside), copy.outside
