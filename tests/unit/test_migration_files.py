"""The migration files keep the rules that let the previous release run beside a new schema."""

from __future__ import annotations

import re

import pytest

from taskmesh.store import migrator
from taskmesh.store.migrator import migrations

FIRST_RULED = 23
"""The first migration written under these rules (the ones before are history, applied as they are)."""
BIG_TABLES = ("tasks", "task_runs", "task_search", "audit_events")
WIDENED = {"tasks_status_check": "tasks_status_valid"}
"""CHECKs replaced by a wider one that the same file validates first: the previous release writes nothing
the wider one refuses, so dropping the narrower one takes nothing from it."""


def test_every_file_parses_and_the_numbers_have_no_gaps() -> None:
    versions = [m.version for m in migrations()]
    assert versions == list(range(1, len(versions) + 1))


@pytest.mark.parametrize("migration", [m for m in migrations() if m.version >= FIRST_RULED], ids=lambda m: m.name)
def test_a_migration_that_removes_is_a_contract_step_and_indexes_on_big_tables_are_built_concurrently(
    migration: migrator.Migration,
) -> None:
    sql = "\n".join(line for line in migration.sql.splitlines() if not line.lstrip().startswith("--"))
    for narrow, wide in WIDENED.items():
        if re.search(rf"VALIDATE\s+CONSTRAINT\s+{wide}\b", sql, re.I):
            sql = re.sub(rf"DROP\s+CONSTRAINT\s+(IF\s+EXISTS\s+)?{narrow}\b", "", sql, flags=re.I)
    removes = re.search(
        r"\bDROP\s+(INDEX|COLUMN|TABLE|CONSTRAINT)\b|\bRENAME\b|\bALTER\s+COLUMN\s+\w+\s+TYPE\b", sql, re.I
    )
    if removes:
        assert migration.contract, f"{migration.name}: {removes.group(0)} in an expand step breaks the previous release"
    for table in re.findall(r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?!CONCURRENTLY)\S+\s+ON\s+(\w+)", sql, re.I):
        assert table not in BIG_TABLES, f"{migration.name}: an index on {table} built without CONCURRENTLY"


def test_an_unknown_directive_is_refused_and_a_no_transaction_file_splits_around_function_bodies() -> None:
    with pytest.raises(ValueError, match="unknown directive 'contrakt'"):
        migrator._parse(99, "x", "-- taskmesh: contrakt\nSELECT 1;\n")
    sql = (
        "-- taskmesh: no-transaction\n-- why\nCREATE INDEX CONCURRENTLY a ON t (x);\n"
        "DO $$\nBEGIN\n    -- inside; kept\n    PERFORM 1;\n    COMMIT;\nEND\n$$;\nSELECT 2;\n"
    )
    parsed = migrator._parse(99, "x", sql)
    assert not parsed.transactional and not parsed.contract
    assert parsed.statements() == [
        "CREATE INDEX CONCURRENTLY a ON t (x)",
        "DO $$\nBEGIN\n    -- inside; kept\n    PERFORM 1;\n    COMMIT;\nEND\n$$",
        "SELECT 2",
    ]
