"""The limits come from the settings with the documented defaults; the open-files limit is raised."""

from __future__ import annotations

import resource

import pytest

from taskmesh.api.connections import address_key
from taskmesh.api.server import HttpLimits, raise_open_files_limit
from taskmesh.config import load_settings
from taskmesh.errors import ConfigError


def test_the_settings_defaults_are_the_limits_defaults() -> None:
    limits = HttpLimits.from_settings(load_settings())
    assert limits == HttpLimits()
    assert (limits.max_header_bytes, limits.read_timeout_seconds, limits.max_connections) == (65536, 30.0, 1000)


def test_the_limits_are_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKMESH_HTTP_MAX_HEADER_BYTES", "8192")
    monkeypatch.setenv("TASKMESH_HTTP_READ_TIMEOUT_SECONDS", "2.5")
    monkeypatch.setenv("TASKMESH_HTTP_MAX_CONNECTIONS", "20")
    assert HttpLimits.from_settings(load_settings()) == HttpLimits(8192, 2.5, 20)
    monkeypatch.setenv("TASKMESH_HTTP_MAX_CONNECTIONS", "0")
    with pytest.raises(ConfigError, match="http_max_connections"):
        load_settings()
    with pytest.raises(ValueError, match="read_timeout_seconds"):
        HttpLimits(read_timeout_seconds=0)


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 64:
        pytest.skip(f"hard open-files limit {hard} cannot be tested here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard // 2, hard))
    try:
        assert raise_open_files_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_per_address_cap_is_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().http_max_connections_per_address == 100
    monkeypatch.setenv("TASKMESH_HTTP_MAX_CONNECTIONS_PER_ADDRESS", "7")
    assert HttpLimits.from_settings(load_settings()).max_connections_per_address == 7
    for bad in ("0", "many"):
        monkeypatch.setenv("TASKMESH_HTTP_MAX_CONNECTIONS_PER_ADDRESS", bad)
        with pytest.raises(ConfigError, match="http_max_connections_per_address"):
            load_settings()
    with pytest.raises(ValueError, match="max_connections_per_address must be positive"):
        HttpLimits(max_connections_per_address=0)


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:1:2:3", "2001:db8:1:2::/64"),
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("fe80::1%eth0", "fe80::/64"),
        (None, None),
    ],
)
def test_a_client_counts_by_its_ipv4_address_or_its_ipv6_64(host: str | None, key: str | None) -> None:
    assert address_key(host) == key
