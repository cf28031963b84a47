"""The limits come from the settings with the documented defaults; the open-files limit is raised."""

from __future__ import annotations

import resource

import pytest

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
