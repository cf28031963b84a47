"""What the instance logs of its stores' URLs (``instance_starting``): where they are, never a password."""

from __future__ import annotations

import pytest

from taskmesh.observability.logs import store_address


@pytest.mark.parametrize(
    ("url", "logged"),
    [
        (
            "postgresql://app:s3cret@db:5432/jobs?sslmode=require&password=x",
            "postgresql://db:5432/jobs?sslmode=require",
        ),
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("rediss://user:s3cret@cache.internal:6380/2", "rediss://cache.internal:6380/2"),
        ("redis+sentinel://u:s3cret@h1:26379,h2:26379/main/0", "redis+sentinel://h1:26379,h2:26379/main/0"),
        ("postgresql:///jobs?host=/run/pg&sslpassword=s3cret", "postgresql:///jobs?host=/run/pg"),
        ("postgresql://[::1]:5432/jobs", "postgresql://[::1]:5432/jobs"),
        ("redis://[::1", "redis://?"),
    ],
)
def test_a_store_url_is_logged_without_its_credentials(url: str, logged: str) -> None:
    assert store_address(url) == logged
