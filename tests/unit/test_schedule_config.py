"""``[[schedules]]`` declarations: parsing, and every validation error naming the schedule and key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taskmesh.config import check_schedule_tasks, load_settings
from taskmesh.errors import ConfigError
from tests.unit.test_config import clean_env  # noqa: F401  (autouse: no TASKMESH_* leaks in)

NIGHTLY = """
[[schedules]]
name = "nightly-report"
cron = "0 2 * * *"
timezone = "Asia/Shanghai"
task = "reports.nightly"
queue = "reports"
priority = 10
payload = {format = "pdf"}
misfire = "skip"
misfire_grace_seconds = 300
overlap = "skip"
"""


def write(tmp_path: Path, text: str) -> None:
    (tmp_path / "taskmesh.toml").write_text(text)


def test_a_toml_schedule_is_read_with_its_defaults(tmp_path: Path) -> None:
    write(tmp_path, NIGHTLY + '\n[[schedules]]\nname = "hourly"\ncron = "@hourly"\ntask = "t"\n')
    nightly, hourly = load_settings().schedules
    assert (nightly.name, nightly.timezone, nightly.queue, nightly.priority) == (
        "nightly-report",
        "Asia/Shanghai",
        "reports",
        10,
    )
    assert nightly.payload == {"format": "pdf"}
    assert (nightly.misfire, nightly.misfire_grace_seconds, nightly.overlap) == ("skip", 300, "skip")
    assert (hourly.timezone, hourly.queue, hourly.misfire, hourly.overlap, hourly.enabled) == (
        "UTC",
        None,
        "once",
        "allow",
        True,
    )
    assert hourly.misfire_grace_seconds == 60


def test_schedules_come_from_a_json_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "TASKMESH_SCHEDULES", json.dumps([{"name": "tick", "cron": "*/10 * * * * *", "task": "t", "enabled": False}])
    )
    [tick] = load_settings().schedules
    assert tick.cron == "*/10 * * * * *" and tick.enabled is False


def test_invalid_json_in_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKMESH_SCHEDULES", '[{"name": "tick"')
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value).startswith("TASKMESH_SCHEDULES: not valid JSON (")


def test_a_changed_declaration_changes_its_hash() -> None:
    a = load_settings(schedules=[{"name": "a", "cron": "@daily", "task": "t"}]).schedules[0]
    b = load_settings(schedules=[{"name": "a", "cron": "@daily", "task": "t", "misfire": "all"}]).schedules[0]
    same = load_settings(schedules=[{"name": "a", "task": "t", "cron": "@daily"}]).schedules[0]
    assert a.config_hash() != b.config_hash()
    assert a.config_hash() == same.config_hash()


BASE = {"name": "nightly", "cron": "0 2 * * *", "task": "reports.nightly"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"cron": "0 2 * *"},
            "schedules[nightly].cron: '0 2 * *' has 4 fields; expected 5 (minute hour day month "
            "weekday), 6 (seconds first) or an alias like @daily",
        ),
        (
            {"cron": "0 25 * * *"},
            "schedules[nightly].cron: '0 25 * * *' is not a valid cron expression: "
            "[0 25 * * *] is not acceptable, out of range",
        ),
        ({"cron": "0 0 30 2 *"}, "schedules[nightly].cron: '0 0 30 2 *' can never fire (no such date)"),
        ({"timezone": "Mars/Olympus"}, "schedules[nightly].timezone: unknown time zone 'Mars/Olympus'"),
        ({"priority": "high"}, "schedules[nightly].priority: Input should be a valid integer"),
        ({"priority": 1001}, "schedules[nightly].priority: Input should be less than or equal to 1000"),
        ({"misfire": "twice"}, "schedules[nightly].misfire: Input should be 'skip', 'once' or 'all'"),
        ({"overlap": "queue"}, "schedules[nightly].overlap: Input should be 'allow' or 'skip'"),
        (
            {"misfire_grace_seconds": -1},
            "schedules[nightly].misfire_grace_seconds: Input should be greater than or equal to 0",
        ),
        ({"enabled": "yes"}, "schedules[nightly].enabled: Input should be a valid boolean"),
        ({"task": "bad name"}, "schedules[nightly].task: String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'"),
        ({"max_retries": 101}, "schedules[nightly].max_retries: Input should be less than or equal to 100"),
        ({"payload": {"a": "x\u0000"}}, "schedules[nightly].payload: contains a NUL character"),
        ({"cronn": "* * * * *"}, "schedules[nightly].cronn: unknown key"),
        ({"name": None}, "schedules[0].name: Input should be a valid string"),
        ({"misfire_grace_seconds": True}, "schedules[nightly].misfire_grace_seconds: Input should be a valid number"),
        ({"misfire_grace_seconds": "5"}, "schedules[nightly].misfire_grace_seconds: Input should be a valid number"),
        (
            {"cron": " "},
            "schedules[nightly].cron: must not be empty (5 fields, 6 with seconds first, or an alias like @daily)",
        ),
        (
            {"timezone": "asia/shanghai"},
            "schedules[nightly].timezone: unknown time zone 'asia/shanghai' "
            "(zone names are case-sensitive: 'Asia/Shanghai')",
        ),
    ],
)
def test_each_bad_key_is_named_with_its_schedule(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(schedules=[{**BASE, **change}])
    assert str(info.value) == f"invalid configuration: {message}"


def test_a_missing_key_and_a_duplicate_name_are_named(tmp_path: Path) -> None:
    write(
        tmp_path,
        '[[schedules]]\nname = "a"\ncron = "@daily"\ntask = "t"\n'
        '[[schedules]]\nname = "a"\ncron = "@hourly"\ntask = "t"\n'
        '[[schedules]]\nname = "b"\ntask = "t"\n',
    )
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == (
        "invalid configuration: schedules[a].name: duplicate schedule name 'a'; schedules[b].cron: required"
    )


def test_schedules_must_be_a_list_of_tables(tmp_path: Path) -> None:
    write(tmp_path, '[schedules]\nname = "a"\n')
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == (
        "invalid configuration: schedules: must be a list of tables ([[schedules]] in TOML, a JSON array in the "
        "environment)"
    )


def test_a_task_no_handler_runs_is_refused_unless_a_fallback_runs_it() -> None:
    settings = load_settings(schedules=[BASE])
    with pytest.raises(ConfigError) as info:
        check_schedule_tasks(settings, {"reports.daily"}, has_fallback=False)
    assert str(info.value) == (
        "invalid configuration: schedules[nightly].task: no handler named 'reports.nightly' is registered "
        "(import its module through the handlers setting)"
    )
    check_schedule_tasks(settings, {"reports.nightly"}, has_fallback=False)
    check_schedule_tasks(settings, set(), has_fallback=True)


def test_the_instance_exits_with_status_2_on_a_bad_schedule_before_starting(tmp_path: Path) -> None:
    write(
        tmp_path,
        'database_url = "postgresql://nobody@127.0.0.1:1/none"\nredis_url = "redis://127.0.0.1:1/0"\n'
        '[[schedules]]\nname = "nightly"\ncron = "0 0 30 2 *"\ntask = "t"\n',
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "taskmesh"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "taskmesh: error: invalid configuration: schedules[nightly].cron: '0 0 30 2 *' can never fire (no such date)"
    )


def test_the_instance_exits_with_status_2_on_a_schedule_without_a_handler(tmp_path: Path) -> None:
    write(
        tmp_path,
        'database_url = "postgresql://nobody@127.0.0.1:1/none"\nredis_url = "redis://127.0.0.1:1/0"\n'
        '[[schedules]]\nname = "nightly"\ncron = "@daily"\ntask = "reports.nightly"\n',
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "taskmesh"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "schedules[nightly].task: no handler named 'reports.nightly' is registered" in proc.stderr


def test_an_entry_that_is_not_a_table_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKMESH_SCHEDULES", '["nightly"]')
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == "invalid configuration: schedules[0]: must be a table with at least name, cron and task"


def test_the_schedules_cli_without_store_urls_says_what_to_set(tmp_path: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_") and k not in {"DATABASE_URL", "REDIS_URL"}
    }
    proc = subprocess.run(
        [sys.executable, "-m", "taskmesh", "schedules"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "taskmesh: error: schedules needs an instance's API (--url or TASKMESH_URL) or the deployment's stores "
        "(DATABASE_URL and REDIS_URL, as the instances have them; the dev profile prints its own as dev_stores when "
        "it starts)"
    )
