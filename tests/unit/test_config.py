from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from taskmesh.config import load_settings, require_stores
from taskmesh.errors import ConfigError
from taskmesh.store.redis_urls import parse_sentinel_url


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("TASKMESH_") or name in {
            "DATABASE_URL",
            "REDIS_URL",
            "HTTP_HOST",
            "HTTP_PORT",
            "QUEUE_NAMES",
            "WORKER_CONCURRENCY",
        }:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_the_original_platforms_variables_keep_their_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PORT", "9090")
    monkeypatch.setenv("QUEUE_NAMES", "default, emails,reports")
    monkeypatch.setenv("WORKER_CONCURRENCY", "4")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/db")
    s = load_settings()
    assert s.http_port == 9090
    assert s.queue_names == ["default", "emails", "reports"]
    assert s.concurrency_of("emails") == 4
    assert s.database_url == "postgresql://u@h/db"


def test_taskmesh_variables_win_over_the_original_platforms_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PORT", "9090")
    monkeypatch.setenv("TASKMESH_HTTP_PORT", "9191")
    monkeypatch.setenv("REDIS_URL", "redis://old:6379/0")
    monkeypatch.setenv("TASKMESH_REDIS_URL", "redis://new:6379/0")
    s = load_settings()
    assert (s.http_port, s.redis_url) == (9191, "redis://new:6379/0")


def test_another_programs_variables_named_like_a_key_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only TASKMESH_<KEY> and the original platform's six names are taskmesh's: a LOG_LEVEL, PREFETCH
    # or AUTH in a shared environment belongs to someone else.
    monkeypatch.setenv("LOG_LEVEL", "debug")
    monkeypatch.setenv("PREFETCH", "7")
    monkeypatch.setenv("AUTH", "none")
    s = load_settings()
    assert (s.log_level, s.prefetch, s.auth) == ("info", 0, "keys")
    monkeypatch.setenv("TASKMESH_LOG_LEVEL", "debug")
    monkeypatch.setenv("TASKMESH_PREFETCH", "7")
    assert (load_settings().log_level, load_settings().prefetch) == ("debug", 7)


def test_worker_processes_need_a_port_for_each_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKMESH_WORKER_PROCESSES", "3")
    monkeypatch.setenv("HTTP_PORT", "65533")
    assert load_settings().worker_process_count() == 3  # 65533, 65534 and 65535
    monkeypatch.setenv("HTTP_PORT", "65534")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (
        "invalid configuration: worker_processes: 3 processes need http_port 65534 to 65536"
        " (one port up for each worker process), past 65535"
    )
    monkeypatch.setenv("HTTP_PORT", "0")  # every child takes a free port
    assert load_settings().worker_process_count() == 3


def test_the_toml_file_sets_per_queue_concurrency_and_env_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "taskmesh.toml").write_text(
        'queue_names = ["default", "pdf"]\nworker_concurrency = 2\nhttp_port = 7000\n[queues.pdf]\nconcurrency = 8\n'
    )
    monkeypatch.setenv("HTTP_PORT", "7001")
    s = load_settings()
    assert s.concurrency_of("pdf") == 8
    assert s.concurrency_of("default") == 2
    assert s.http_port == 7001


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HTTP_PORT": "eighty"}, "http_port: Input should be a valid integer, unable to parse string as an integer"),
        ({"WORKER_CONCURRENCY": "0"}, "worker_concurrency: Input should be greater than or equal to 1"),
        ({"QUEUE_NAMES": "a b"}, "queue_names: queue name 'a b' must match [A-Za-z0-9_.:-]{1,128}"),
        ({"QUEUE_NAMES": " , "}, "queue_names: must name at least one queue"),
        ({"DATABASE_URL": "host=localhost dbname=tasks"}, "database_url: must be a postgresql:// URL"),
        (
            {"REDIS_URL": "localhost:6379"},
            "redis_url: must be a redis://, rediss://, unix:// or redis+sentinel:// URL, not no scheme",
        ),
        (
            {"REDIS_URL": "http://h:6379"},
            "redis_url: must be a redis://, rediss://, unix:// or redis+sentinel:// URL, not http://",
        ),
        (
            {"REDIS_URL": "redis+sentinel://:secret@/tm"},
            "redis_url: name at least one Sentinel: redis+sentinel://host:26379,host:26379/master-name",
        ),
        (
            {"REDIS_URL": "redis+sentinel://s1:26379,s2:x/tm"},
            "redis_url: the Sentinel address 's2:x' is not host:port",
        ),
        (
            {"REDIS_URL": "redis+sentinel://s1:26379,s2:26379"},
            "redis_url: name the master after the Sentinels: redis+sentinel://host:26379/master-name[/db]",
        ),
        (
            {"REDIS_URL": "redis+sentinel://:secret@s1,s2/tm/one"},
            "redis_url: the database number 'one' is not a whole number (0 to 15 on a default server)",
        ),
        (
            {"REDIS_URL": "redis+sentinel://s1,s2/tm/0?password=x"},
            "redis_url: the option 'password' is not one a Sentinel URL takes (sentinel_username, sentinel_password)",
        ),
        (
            {"REDIS_URL": "redis://:secret@h:6379/3", "TASKMESH_REDIS_MODE": "cluster"},
            "redis_mode: a Redis Cluster has database 0 alone (it refuses SELECT): end redis_url with /0 or no number",
        ),
        (
            {"REDIS_URL": "redis+sentinel://s1,s2/tm/0", "TASKMESH_REDIS_MODE": "cluster"},
            'redis_mode: a redis+sentinel:// URL names one master, not a cluster: use redis_mode = "standalone"',
        ),
        (
            {"REDIS_URL": "unix:///run/redis.sock", "TASKMESH_REDIS_MODE": "cluster"},
            "redis_mode: a Redis Cluster is reached over TCP: redis_url must be redis:// or rediss:// in cluster mode",
        ),
        (
            {"TASKMESH_REDIS_MODE": "sharded"},
            "redis_mode: Input should be 'standalone' or 'cluster'",
        ),
        (
            {"REDIS_URL": "redis://:secret@h:6379/abc"},
            "redis_url: the database number 'abc' is not a whole number (0 to 15 on a default server)",
        ),
        (
            {"REDIS_URL": "unix:///run/redis.sock?db=-1"},
            "redis_url: the database number '-1' is not a whole number (0 to 15 on a default server)",
        ),
        (
            {"REDIS_URL": "redis://h:port/0"},
            "redis_url: redis-py cannot read it: Port could not be cast to integer value as 'port'",
        ),
        (
            {"REDIS_URL": "rediss://h:6379/0?ssl_ca_cert=/etc/ca.pem"},
            "redis_url: the option 'ssl_ca_cert' is not one redis-py knows "
            "(such as ssl_ca_certs, ssl_cert_reqs, socket_timeout)",
        ),
        (
            {"REDIS_URL": "redis://h:6379/0?socket_timeout=soon"},
            "redis_url: redis-py cannot read it: Invalid value for 'socket_timeout' in connection URL.",
        ),
        ({"TASKMESH_LOG_LEVEL": "loud"}, "log_level: must be one of debug, info, warning, error"),
        (
            {"TASKMESH_SHUTDOWN_GRACE_SECONDS": "-1"},
            "shutdown_grace_seconds: Input should be greater than or equal to 0",
        ),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == f"invalid configuration: {message}"


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database() -> None:
    target = parse_sentinel_url("rediss+sentinel://app:p%40ss@s1:26380,s2,[::1]:26381/tm-main/2?sentinel_password=sp")
    assert target.sentinels == [("s1", 26380), ("s2", 26379), ("::1", 26381)]
    assert (target.master, target.db, target.username, target.password) == ("tm-main", 2, "app", "p@ss")
    assert target.tls and target.sentinel_password == "sp"
    assert "p@ss" not in repr(target) and "'sp'" not in repr(target)


def test_an_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    (tmp_path / "taskmesh.toml").write_text("http_prot = 1\n")
    with pytest.raises(ConfigError, match="http_prot: unknown setting"):
        load_settings()


def test_a_missing_config_file_named_by_taskmesh_config_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKMESH_CONFIG", "/nonexistent/taskmesh.toml")
    with pytest.raises(ConfigError, match=re.escape("TASKMESH_CONFIG: file /nonexistent/taskmesh.toml does not exist")):
        load_settings()


def test_missing_store_urls_name_both_settings_and_point_to_dev() -> None:
    with pytest.raises(ConfigError) as info:
        require_stores(load_settings())
    assert str(info.value).startswith("DATABASE_URL and REDIS_URL not set")
    assert "python -m taskmesh dev" in str(info.value)


def test_the_instance_exits_with_status_2_without_database_url(tmp_path: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_") and k not in {"DATABASE_URL", "REDIS_URL"}
    }
    env["REDIS_URL"] = "redis://127.0.0.1:6379/0"
    proc = subprocess.run(
        [sys.executable, "-m", "taskmesh"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "DATABASE_URL not set" in proc.stderr
    assert "python -m taskmesh dev" in proc.stderr
